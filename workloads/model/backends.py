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
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from workloads.model import sampler
from workloads.model.capture import ChunkedCapture
from workloads.model.hooks import capture_final_norm


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
        device = next(self.model.parameters()).device
        batch, width = len(prompts), max(map(len, prompts))
        ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)

        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        # Rows stay on the device; one copy to the host per 32 decode steps (workloads/model/capture.py).
        capture = ChunkedCapture()
        done = torch.zeros(batch, dtype=torch.bool)
        cache = None
        hook = capture_final_norm(self.model, last_only=True) if capture_hidden else None
        captured = hook.__enter__() if hook else []
        stream = None
        if stream_proofs:
            from workloads.toploc.stream import ProofStream  # noqa: PLC0415 - proofs are optional

            stream = ProofStream()
        try:
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
                    capture.add(captured[-1])
                captured.clear()
                next_tok, next_lp = sampler.sample(out.logits[:, -1, :], seeds, [step] * batch, temperature)
                next_tok, next_lp = next_tok.cpu(), next_lp.cpu()
                for i in range(batch):
                    if not done[i]:
                        tokens[i].append(int(next_tok[i]))
                        logprobs[i].append(float(next_lp[i]))
                if stream and step and step % stream.chunk_size == 0:
                    # Rows that sampled token `step` have decode rows 0..step-1: chunk step/32 - 1 is final
                    # (and on the host: the capture copied it when its 32nd row came in).
                    rows = [i for i in range(batch) if len(tokens[i]) > step]
                    chunk = step // stream.chunk_size - 1
                    stream.add_chunk(chunk, rows, capture.block(chunk)[rows])
                done |= next_tok == self.eos_token_id
                if bool(done.all()) or step == max_new_tokens - 1:
                    break
                # Finished rows keep decoding a pad token (their outputs are ignored): simpler than
                # reshaping the cache and cheap at these batch sizes.
                feed = torch.where(done, torch.tensor(self.pad_token_id), next_tok)
                ids = feed.view(-1, 1).to(device)
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
                positions = positions[:, -1:] + 1
        except BaseException:
            if stream:
                stream.close()
            raise
        finally:
            if hook:
                hook.__exit__(None, None, None)

        # [batch, decode steps, hidden] on the host; zero steps when every sequence stopped at once
        stacked = capture.result(batch, self.model.config.hidden_size, self.model.dtype)
        results = []
        for i in range(batch):
            n = len(tokens[i])
            hid = stacked[i, : n - 1].clone() if capture_hidden else None  # own storage per sequence
            results.append(Completion(tokens[i], logprobs[i], hid, tokens[i][-1] == self.eos_token_id))
        if stream:
            # stream_proofs requires capture_hidden (checked above): every completion has hidden states.
            hiddens = [c.hidden for c in results if c.hidden is not None]
            for completion, proof in zip(results, stream.finish(hiddens), strict=True):
                completion.proof = proof
        self.stats.seconds += time.perf_counter() - started
        self.stats.output_tokens += sum(len(t) for t in tokens)
        return results
