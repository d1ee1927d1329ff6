"""Inference backends behind one interface.

`TorchBackend` runs anywhere (CPU here, GPU elsewhere): batched KV-cache decoding over left-padded
prompts, per-sequence Gumbel-max sampling, and the final-norm hidden state of every decode position
captured by a forward hook. `VLLMBackend` (workloads/model/vllm_backend.py) runs vLLM's V1 engine, on a
GPU or a CPU, installed on its own by `make vllm`.

Which hidden states: the decode positions of a completion of n tokens are the positions whose input
is an output token that was fed back, i.e. output tokens 0..n-2 (the last token is never fed). A
completion of one token therefore has no decode positions and an empty proof, as in toploc.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from workloads.model import sampler
from workloads.model.capture import ChunkedCapture
from workloads.model.hooks import capture_final_norm

if TYPE_CHECKING:  # proofs are optional: imported when asked for (TorchBackend.generate)
    from workloads.toploc.stream import ProofStream


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    hidden: torch.Tensor | None  # [len(tokens) - 1, hidden_size] in the model dtype, or None
    finished: bool  # ended with EOS (else it hit max_new_tokens)
    proof: bytes | None = None  # TOPLOC proof, when the backend built it while decoding


@dataclass
class GenerationStats:
    seconds: float = 0.0
    output_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def check_batch(prompts: list[list[int]], seeds: list[int], max_new_tokens: int) -> bool:
    """A batch every backend can decode: one seed a prompt, no empty prompt, at least one new token
    (ValueError naming what is wrong otherwise). False for an empty batch: nothing to decode."""
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    return bool(prompts)


@runtime_checkable
class InferenceBackend(Protocol):
    eos_token_id: int

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        capture_hidden: bool = True,
    ) -> list[Completion]: ...


def left_padded(
    prompts: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`ids`, `mask` and `positions` of a batch, each [batch, width] on `device`: prompts right-aligned
    (left-padded), so every row's next token goes in the same column and one decode step feeds one
    column; positions count from each prompt's own first token, as an unpadded prompt's would."""
    batch, width = len(prompts), max(map(len, prompts))
    ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, positions


def stream_chunk(stream: ProofStream, step: int, tokens: list[list[int]], capture: ChunkedCapture) -> None:
    """Hand `stream` the hidden-state chunk that decode step `step` completed, if it completed one, so
    its proof is built while decoding goes on."""
    if not step or step % stream.chunk_size:
        return
    # Rows that sampled token `step` have decode rows 0..step-1: chunk step/32 - 1 is final
    # (and on the host: the capture copied it when its 32nd row came in).
    rows = [i for i in range(len(tokens)) if len(tokens[i]) > step]
    chunk = step // stream.chunk_size - 1
    stream.add_chunk(chunk, rows, capture.block(chunk)[rows])


@dataclass
class Decoded:
    """What the decode loop leaves: each sequence's tokens and their logprobs, and the hidden states
    of its decode positions (copied to the host 32 rows at a time: workloads/model/capture.py)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    capture: ChunkedCapture


class TorchBackend:
    def __init__(self, model: PreTrainedModel, eos_token_id: int, pad_token_id: int | None = None):
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = eos_token_id if pad_token_id is None else pad_token_id
        self.stats = GenerationStats()

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        capture_hidden: bool = True,
        stream_proofs: bool = False,
    ) -> list[Completion]:
        """Decode a batch. `stream_proofs` also builds each completion's TOPLOC proof, chunk by
        chunk on a background thread while decoding goes on (`Completion.proof`)."""
        if stream_proofs and not capture_hidden:
            raise ValueError("stream_proofs needs capture_hidden=True")
        if not check_batch(prompts, seeds, max_new_tokens):
            return []
        started = time.perf_counter()
        stream = None
        if stream_proofs:
            from workloads.toploc.stream import ProofStream  # noqa: PLC0415 - proofs are optional

            stream = ProofStream()
        try:
            decoded = self._decode(prompts, seeds, max_new_tokens, temperature, capture_hidden, stream)
        except BaseException:
            if stream:
                stream.close()
            raise
        results = self._completions(decoded, capture_hidden)
        if stream:
            # stream_proofs requires capture_hidden (checked above): every completion has hidden states.
            hiddens = [c.hidden for c in results if c.hidden is not None]
            for completion, proof in zip(results, stream.finish(hiddens), strict=True):
                completion.proof = proof
        self.stats.seconds += time.perf_counter() - started
        self.stats.output_tokens += sum(len(t) for t in decoded.tokens)
        return results

    def _decode(
        self, prompts: list[list[int]], seeds: list[int], max_new_tokens: int, temperature: float,
        capture_hidden: bool, stream: ProofStream | None,
    ) -> Decoded:  # fmt: skip
        """The KV-cache decode loop: one batched forward per new token until every sequence has
        sampled EOS or `max_new_tokens` tokens."""
        device = next(self.model.parameters()).device
        batch = len(prompts)
        ids, mask, positions = left_padded(prompts, self.pad_token_id, device)
        # Rows stay on the device; one copy to the host per 32 decode steps (workloads/model/capture.py).
        decoded = Decoded([[] for _ in prompts], [[] for _ in prompts], ChunkedCapture())
        done = torch.zeros(batch, dtype=torch.bool)
        cache = None
        hook: AbstractContextManager[list[torch.Tensor]] = (
            capture_final_norm(self.model, last_only=True) if capture_hidden else nullcontext([])
        )
        with hook as captured:
            for step in range(max_new_tokens):
                out = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                cache = out.past_key_values
                if step > 0 and capture_hidden:  # the hidden state of output token step-1
                    decoded.capture.add(captured[-1])
                captured.clear()
                next_tok, next_lp = sampler.sample(out.logits[:, -1, :], seeds, [step] * batch, temperature)
                next_tok, next_lp = next_tok.cpu(), next_lp.cpu()
                for i in range(batch):
                    if not done[i]:
                        decoded.tokens[i].append(int(next_tok[i]))
                        decoded.logprobs[i].append(float(next_lp[i]))
                if stream:
                    stream_chunk(stream, step, decoded.tokens, decoded.capture)
                done |= next_tok == self.eos_token_id
                if bool(done.all()) or step == max_new_tokens - 1:
                    break
                # Finished rows keep decoding a pad token (their outputs are ignored): simpler than
                # reshaping the cache and cheap at these batch sizes.
                feed = torch.where(done, torch.tensor(self.pad_token_id), next_tok)
                ids = feed.view(-1, 1).to(device)
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
                positions = positions[:, -1:] + 1
        return decoded

    def _completions(self, decoded: Decoded, capture_hidden: bool) -> list[Completion]:
        """One Completion a sequence, each with hidden states of its own (a copy, not a view of the
        batch's: a kept completion does not hold the whole batch's memory)."""
        batch = len(decoded.tokens)
        # [batch, decode steps, hidden] on the host; zero steps when every sequence stopped at once
        stacked = decoded.capture.result(batch, self.model.config.hidden_size, self.model.dtype)
        results = []
        for i, tokens in enumerate(decoded.tokens):
            hid = stacked[i, : len(tokens) - 1].clone() if capture_hidden else None
            results.append(Completion(tokens, decoded.logprobs[i], hid, tokens[-1] == self.eos_token_id))
        return results
