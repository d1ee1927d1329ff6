"""Proofs built while decoding (stream_proofs) are the proofs built afterwards, and they verify."""

from __future__ import annotations

import pytest

from workloads.datasets import load_dataset
from workloads.inference.generate import make_rollouts
from workloads.inference.judge.calibration import resolve_limits
from workloads.inference.judge.checks.model import recompute
from workloads.inference.selection import plan_batch
from workloads.model.backends import TorchBackend
from workloads.toploc import build_proofs_batch

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


def test_streamed_proofs_equal_batch_proofs_with_eos_at_chunk_edges(tiny_model, tiny_tokenizer, prompts):
    # A near-uniform temperature makes completions stop anywhere, also around the 32-position chunk edges.
    backend = TorchBackend(tiny_model, tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)
    rows = prompts * 4
    completions = backend.generate(
        rows, list(range(len(rows))), max_new_tokens=80, temperature=50.0, stream_proofs=True
    )
    lengths = sorted(len(c.tokens) for c in completions)
    assert lengths[0] < 33 < lengths[-1], lengths  # some stop before the first chunk, some after
    assert [c.proof for c in completions] == build_proofs_batch([c.hidden for c in completions])


def test_stream_needs_hidden_states(backend, prompts):
    with pytest.raises(ValueError, match="stream_proofs needs capture_hidden"):
        backend.generate(
            prompts,
            [1] * len(prompts),
            max_new_tokens=4,
            temperature=1.0,
            capture_hidden=False,
            stream_proofs=True,
        )


def test_streamed_rollouts_are_identical_and_verify(tiny_model, tiny_tokenizer):
    backend = TorchBackend(tiny_model, -1, tiny_tokenizer.pad_token_id)  # fixed length: full chunks
    records = load_dataset("demo")
    plan = plan_batch(NODE, 1, len(records), 4, 2, [8])
    kw = dict(step=1, max_new_tokens=70, temperature=1.0, length_penalty=3e-4)
    after, _ = make_rollouts(backend, tiny_tokenizer, records, plan, **kw)
    streamed, _ = make_rollouts(backend, tiny_tokenizer, records, plan, stream_proofs=True, **kw)
    assert [r.proofs for r in streamed] == [r.proofs for r in after]
    assert all(len(r.proofs) == 2 * 258 + 2 + 2 * 128 for r in streamed)  # 69 positions: 2 full + tail
    th = resolve_limits("tiny", {}).thresholds  # as the validator judges the tiny model's files
    findings, _ = recompute(tiny_model, streamed, eos_token_id=-1, pad_token_id=tiny_tokenizer.pad_token_id,
                            max_new_tokens=70, th=th)  # fmt: skip
    assert not findings, [f.reason for f in findings]
