"""Honest rollouts verify by one prefill; tampered ones fail (TOPLOC + sampling + termination).

Each file is recomputed by the judge's `recompute` under the tiny model's limits as the validator
resolves them (its calibration record): the one recomputation there is, so these tests check what the
validator runs. A row fails a rule when a finding names it; file statistics name no rows."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workloads.datasets import load_dataset
from workloads.inference.generate import make_rollouts
from workloads.inference.judge.calibration import resolve_limits
from workloads.inference.judge.checks.model import CUT_SHORT, recompute
from workloads.inference.judge.grades import Finding
from workloads.inference.judge.thresholds import ValidationThresholds
from workloads.inference.selection import plan_batch
from workloads.model.backends import TorchBackend
from workloads.model.loading import load_model
from workloads.model.train import tiny_config
from workloads.rollouts import BatchInfo, read_rollouts, write_rollouts

pytest.importorskip("workloads.toploc")

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"
MAX_NEW = 16
REPO = Path(__file__).resolve().parents[2]


def generate(backend, tokenizer, batch_size: int = 6, n: int = 2):
    records = load_dataset("demo")
    plan = plan_batch(NODE, 1, len(records), batch_size, n, [8])
    rollouts, _ = make_rollouts(
        backend,
        tokenizer,
        records,
        plan,
        step=1,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        length_penalty=3e-4,
    )
    return rollouts


@pytest.fixture(scope="module")
def honest(backend, tiny_tokenizer):
    return generate(backend, tiny_tokenizer)


def check(model, rollouts, th: ValidationThresholds | None = None, max_new_tokens: int = MAX_NEW, **kw):
    """The judge's findings on `rollouts` (the tiny model's limits unless `th`; `kw` overrides them)."""
    limits = (th or resolve_limits("tiny", {}).thresholds).model_copy(update=kw)
    findings, _ = recompute(model, rollouts, eos_token_id=1, pad_token_id=0, max_new_tokens=max_new_tokens,
                            th=limits)  # fmt: skip
    return findings


def failing(findings: list[Finding], rule: str | None = None) -> set[int]:
    """Rows a row rule (`rule`, or any) fails."""
    return {r for f in findings if rule in (None, f.rule) for r in f.rows}


@pytest.mark.parametrize("prefill_batch_size", [1, 5, 64])
def test_honest_rollouts_verify_at_any_batch_size(tiny_model, honest, prefill_batch_size):
    findings = check(tiny_model, honest, prefill_batch_size=prefill_batch_size)
    assert not findings, [f.reason for f in findings]
    assert all(len(r.proofs) == 258 for r in honest if len(r.output_tokens) > 1)


def test_honest_rollouts_verify_with_reference_thresholds(tiny_model, honest):
    assert not check(tiny_model, honest, th=ValidationThresholds.reference())


def test_generation_batch_size_does_not_matter(backend, tiny_model, honest):
    # The same (prompt, seed) pairs decoded in batches of 1 and 5 instead of 12: identical tokens,
    # and proofs built from those decode activations verify.
    from workloads.inference.generate import proofs_for

    for size in (1, 5):
        rows = []
        for i in range(0, len(honest), size):
            part = honest[i : i + size]
            comps = backend.generate(
                [r.input_tokens for r in part],
                [r.seed for r in part],
                max_new_tokens=MAX_NEW,
                temperature=1.0,
            )
            for r, c, proof in zip(part, comps, proofs_for(comps), strict=True):
                assert c.tokens == r.output_tokens
                rows.append(r.model_copy(update={"proofs": proof, "output_logprobs": c.logprobs}))
        assert not check(tiny_model, rows)


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_verified_in_a_second_process(tmp_path, honest):
    path = tmp_path / "r.parquet"
    write_rollouts(
        path,
        honest,
        BatchInfo(node_address=NODE, step=1, batch_counter=1, group_size=2, max_new_tokens=MAX_NEW),
    )
    script = (
        "import json, sys\n"
        "from workloads.inference.judge.calibration import resolve_limits\n"
        "from workloads.inference.judge.checks.model import recompute\n"
        "from workloads.model.loading import load_model\n"
        "from workloads.rollouts import read_rollouts\n"
        "rows, info = read_rollouts(sys.argv[1])\n"
        "th = resolve_limits('tiny', {'prefill_batch_size': 3}).thresholds\n"
        "found, stats = recompute(load_model('tiny'), rows, eos_token_id=1, pad_token_id=0,\n"
        "                         max_new_tokens=info.max_new_tokens, th=th)\n"
        "print(json.dumps({'reasons': [f.reason for f in found], 'rows': stats.rows}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"reasons": [], "rows": len(honest)}
    assert read_rollouts(path)[0] == honest


def _noised(model, scale: float, only: str | None = None):
    bad = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in bad.named_parameters():
            if p.dim() == 2 and "embed" not in name and (only is None or only in name):
                noise = torch.randn(p.shape, generator=gen) * p.float().std() * scale
                p.add_(noise.to(p.dtype))
    return bad


TOPLOC_RULES = {"toploc", "toploc share", "toploc mean"}  # per chunk, and the file's fingerprint


def test_perturbed_weights_fail(tiny_model, honest):
    # 3 % of each matrix's spread as noise, in one layer only: a tampered checkpoint. Under the tiny
    # model's limits it shows in the file's TOPLOC statistics over all its chunks (no single chunk).
    findings = check(_noised(tiny_model, 0.03, only="layers.1."), honest)
    assert {f.rule for f in findings} & TOPLOC_RULES, [f.reason for f in findings]


def test_different_model_fails(honest):
    torch.manual_seed(1)
    from transformers import Qwen2ForCausalLM

    other = Qwen2ForCausalLM(tiny_config(99, 1, 0)).to(torch.bfloat16).eval()
    assert failing(check(other, honest), "toploc") == set(range(len(honest)))


def test_fp32_inference_fails(tiny_tokenizer, tiny_model):
    fp32 = load_model("tiny", dtype=torch.float32)
    rows = generate(TorchBackend(fp32, 1, 0), tiny_tokenizer)
    assert check(tiny_model, rows)


def test_changed_prompt_fails(tiny_model, honest, tiny_tokenizer):
    digit = tiny_tokenizer("7")["input_ids"][0]
    changed = [r.model_copy(update={"input_tokens": [digit, *r.input_tokens]}) for r in honest]
    assert len(failing(check(tiny_model, changed))) >= len(changed) // 2


def test_swapped_completions_fail(tiny_model, honest):
    k = len(honest) // 2
    swapped = [
        r.model_copy(
            update={
                "output_tokens": honest[(i + k) % len(honest)].output_tokens,
                "output_logprobs": honest[(i + k) % len(honest)].output_logprobs,
            }
        )
        for i, r in enumerate(honest)
    ]
    changed = [i for i, r in enumerate(swapped) if r.output_tokens != honest[i].output_tokens]
    assert changed and failing(check(tiny_model, swapped)) >= set(changed)


def test_truncated_output_fails(tiny_model, honest):
    cut = [
        r.model_copy(
            update={"output_tokens": r.output_tokens[:-1], "output_logprobs": r.output_logprobs[:-1]}
        )
        for r in honest
        if len(r.output_tokens) > 2
    ]
    findings = check(tiny_model, cut)
    assert cut and failing(findings, CUT_SHORT) == set(range(len(cut)))
    assert next(f for f in findings if f.rule == CUT_SHORT).exact  # slashes whatever the model's noise


def test_wrong_seed_fails_sampling_check(tiny_model, honest):
    lied = [r.model_copy(update={"seed": r.seed + 1, "temperature": 2.0}) for r in honest]
    assert failing(check(tiny_model, lied), "sampling")


def test_one_token_completions_have_empty_proofs_and_verify(backend, tiny_tokenizer, tiny_model):
    records = load_dataset("demo")
    plan = plan_batch(NODE, 1, len(records), 3, 2, [8])
    rows, _ = make_rollouts(
        backend, tiny_tokenizer, records, plan, step=1, max_new_tokens=1, temperature=1.0, length_penalty=3e-4
    )
    assert all(len(r.output_tokens) == 1 and r.proofs == b"" for r in rows)
    assert not check(tiny_model, rows, max_new_tokens=1)
