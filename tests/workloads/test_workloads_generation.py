"""Generation is a function of the seeds; a validator reproduces it from one prefill."""

from __future__ import annotations

import pytest
import torch

from workloads.model import sampler
from workloads.model.backends import InferenceBackend, TorchBackend
from workloads.model.prefill import prefill, prefill_batch

SEEDS = [101, 202, 303, 404, 505, 606]


def test_backend_satisfies_protocol(backend):
    assert isinstance(backend, InferenceBackend)


def test_same_seeds_same_tokens_regardless_of_batch(backend, prompts):
    a = backend.generate(prompts, SEEDS, max_new_tokens=16, temperature=1.0)
    # Reversed order and a different batch size: each sequence depends only on its own seed.
    b = backend.generate(prompts[::-1], SEEDS[::-1], max_new_tokens=16, temperature=1.0)[::-1]
    single = backend.generate([prompts[2]], [SEEDS[2]], max_new_tokens=16, temperature=1.0)[0]
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert a[2].tokens == single.tokens


def test_different_seeds_change_samples(backend, prompts):
    a = backend.generate(prompts * 3, list(range(18)), max_new_tokens=16, temperature=1.5)
    b = backend.generate(prompts * 3, list(range(100, 118)), max_new_tokens=16, temperature=1.5)
    assert [c.tokens for c in a] != [c.tokens for c in b]


def test_eos_ends_and_max_length_truncates(backend, prompts, tiny_tokenizer):
    out = backend.generate(prompts, SEEDS, max_new_tokens=3, temperature=1.0)
    for c in out:
        assert 1 <= len(c.tokens) <= 3
        assert c.finished == (c.tokens[-1] == tiny_tokenizer.eos_token_id)
        assert tiny_tokenizer.eos_token_id not in c.tokens[:-1]
        assert c.hidden.shape == (len(c.tokens) - 1, 128)
        assert len(c.logprobs) == len(c.tokens)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_validator_reproduces_tokens_from_prefill_logits(backend, tiny_model, prompts, temperature):
    comps = backend.generate(prompts, SEEDS, max_new_tokens=16, temperature=temperature)
    pre = prefill_batch(tiny_model, prompts, [c.tokens for c in comps])
    wrong_seed_differs = 0
    for seed, c, p in zip(SEEDS, comps, pre, strict=True):
        assert sampler.reproduce(p.logits, seed, temperature).tolist() == c.tokens
        assert sampler.sampling_gaps(p.logits, torch.tensor(c.tokens), seed, temperature).max() == 0
        wrong_seed_differs += sampler.reproduce(p.logits, seed + 1, temperature).tolist() != c.tokens
    if temperature > 1:  # a confident model may agree with itself at T = 1; at T = 2 seeds matter
        assert wrong_seed_differs > 0


def test_decode_and_prefill_hidden_states_agree_to_bf16(backend, tiny_model, prompts):
    comps = backend.generate(prompts, SEEDS, max_new_tokens=16, temperature=1.0)
    for c, prompt in zip(comps, prompts, strict=True):
        hidden, logprobs = prefill(tiny_model, prompt, c.tokens)
        assert hidden.dtype == torch.bfloat16 and c.hidden.dtype == torch.bfloat16
        assert hidden.shape == c.hidden.shape
        # bf16 has 8 mantissa bits: values agree to a few ulps, many are bit-identical.
        torch.testing.assert_close(hidden.float(), c.hidden.float(), rtol=2**-6, atol=0.05)
        assert (hidden == c.hidden).float().mean() > 0.2
        torch.testing.assert_close(logprobs, torch.tensor(c.logprobs), rtol=0, atol=0.05)


def test_greedy_is_argmax(backend, tiny_model, prompts):
    comps = backend.generate(prompts[:2], [1, 2], max_new_tokens=8, temperature=0.0)
    again = backend.generate(prompts[:2], [3, 4], max_new_tokens=8, temperature=0.0)
    assert [c.tokens for c in comps] == [c.tokens for c in again]  # seeds do not matter at T = 0
    pre = prefill_batch(tiny_model, prompts[:2], [c.tokens for c in comps])
    for c, p in zip(comps, pre, strict=True):
        assert p.logits.float().argmax(-1).tolist() == c.tokens


def test_noise_is_a_function_of_seed_and_position():
    a = sampler.gumbel_noise(7, 3, 50)
    assert torch.equal(a, sampler.gumbel_noise(7, 3, 50))
    assert not torch.equal(a, sampler.gumbel_noise(7, 4, 50))
    assert not torch.equal(a, sampler.gumbel_noise(8, 3, 50))


def test_bad_generation_input_is_refused(backend, prompts):
    with pytest.raises(ValueError, match="seeds"):
        backend.generate(prompts, [1], max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="empty prompt"):
        backend.generate([[]], [1], max_new_tokens=4, temperature=1.0)


def test_hidden_rows_reach_the_host_once_per_proof_chunk(tiny_model, tiny_tokenizer, prompts):
    """The decode-step rows stay where the model runs and are copied once per 32 steps (issue 57.6:
    on a GPU one device-to-host transfer per chunk; the chunking is the same on the CPU): the blocks
    are exactly the proof chunks, the rows come out in order, and decoding gives the same hidden states
    as before (a row per fed-back token), streamed proofs or not."""
    from workloads.model.capture import ChunkedCapture
    from workloads.toploc import build_proofs_batch

    rows = [torch.full((3, 4), float(i)) for i in range(70)]
    capture = ChunkedCapture()
    done = [i for i, r in enumerate(rows) if capture.add(r) is not None]
    assert done == [31, 63] and capture.copies == 2
    assert torch.equal(capture.block(1)[:, 0], rows[32])
    out = capture.result(3, 4, torch.float32)
    assert capture.copies == 3 and torch.equal(out, torch.stack(rows, dim=1))
    assert ChunkedCapture().result(3, 4, torch.bfloat16).shape == (3, 0, 4)

    fixed = TorchBackend(tiny_model, -1, tiny_tokenizer.pad_token_id)  # EOS off: 70 tokens, 3 chunks a row
    seeds = list(range(len(prompts)))
    plain = fixed.generate(prompts, seeds, max_new_tokens=70, temperature=1.0)
    streamed = fixed.generate(prompts, seeds, max_new_tokens=70, temperature=1.0, stream_proofs=True)
    for a, b in zip(plain, streamed, strict=True):
        assert a.tokens == b.tokens and a.hidden.shape == (69, 128)
        assert torch.equal(a.hidden, b.hidden)
    assert [c.proof for c in streamed] == build_proofs_batch([c.hidden for c in plain])
