"""One forward over prompt + output: what a validator recomputes to check a rollout.

Returns the final-norm hidden states at the decode positions (output tokens 0..n-2, the rows a
TOPLOC proof commits to), the logits that predicted each output token (row i predicts token i) and
the logprobs of the output tokens under the temperature-scaled distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from workloads.model.gemm import fp32_gemm
from workloads.model.hooks import capture_final_norm
from workloads.model.sampler import token_logprobs


@dataclass
class PrefillResult:
    hidden: torch.Tensor  # [n_output - 1, hidden_size], model dtype, on the CPU (TOPLOC runs there)
    logits: torch.Tensor  # [n_output, vocab], model dtype, on the model's device (a view of the batch's)
    logprobs: torch.Tensor  # [n_output], float32, on the CPU


@torch.inference_mode()
def prefill_batch(
    model: PreTrainedModel,
    prompts: list[list[int]],
    outputs: list[list[int]],
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> list[PrefillResult]:
    """Batched prefill. Right padding: a causal model's positions before the padding are unaffected,
    so position ids stay 0..len-1 and no attention mask is needed. On a CPU without bf16 arithmetic
    the linear layers compute through fp32 GEMM (`workloads.model.gemm`: the same sums, 7x faster).

    Logits stay on the model's device: on a GPU, a batch of 64 x 1,024 tokens over a 151,936-entry
    vocabulary is 20 GB of them, which the checks reduce there to a few numbers a token
    (`workloads.inference.judge.checks.tokens.token_checks`) instead of copying them out. Hidden states
    go to the CPU, where TOPLOC takes its top-k exactly as the worker's proof did (on the CPU, moving
    them is a no-op: nothing changes there)."""
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} outputs")
    if any(not p for p in prompts) or any(not o for o in outputs):
        raise ValueError("prefill needs a non-empty prompt and a non-empty output per sample")
    device = next(model.parameters()).device
    seqs = [p + o for p, o in zip(prompts, outputs, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    with capture_final_norm(model, last_only=False) as captured, fp32_gemm(model):
        logits = model(input_ids=ids.to(device), use_cache=False).logits
    hidden = captured[0].cpu()  # one copy off a GPU (a no-op on the CPU)
    results = []
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        start, n = len(p), len(o)
        row_logits = logits[i, start - 1 : start + n - 1]
        lp = token_logprobs(row_logits, torch.tensor(o, device=row_logits.device), temperature).cpu()
        results.append(PrefillResult(hidden[i, start : start + n - 1], row_logits, lp))
    return results


def prefill(
    model: PreTrainedModel, prompt_ids: list[int], output_ids: list[int], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states of the decode positions [n_output - 1, hidden], output logprobs [n_output])."""
    r = prefill_batch(model, [prompt_ids], [output_ids], temperature)[0]
    return r.hidden, r.logprobs
