"""One group member's decode loop: receive, run its stage, send; prove what it sent.

Stage 0 (the driver) holds the batch: prompts (left-padded, as `TorchBackend` pads them) and seeds.
At step 0 it runs the prompts through its layers and sends the activations with the batch's shape
(prompt lengths, seeds, limits) to member 1; each member runs its layers and passes its output on;
the last member samples with the seeded Gumbel sampler (the same tokens one node would draw) and
sends tokens and logprobs back to stage 0, which feeds them in as the next step's input. Stage 0 ends
the batch (every row at EOS or at max_new_tokens) with an `end` frame that travels the ring.

Proofs: each member commits (TOPLOC) to the activations it *sent*: a non-last stage to its output at
every real position (the prompt's and each fed output token's), the last stage to its final-norm
output at the decode positions (a single node's proof). After `end`, each non-last member sends its
proofs to the next one, which builds the proofs of what it received and compares: a member that
proves one thing and sends another is caught there (`MemberMisbehaved`), so the proofs a validator
replays are always those of the activations the next stage really ran on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from workloads.model import sampler
from workloads.pipeline.stages import Stage
from workloads.pipeline.transport import MemberLink, MemberMisbehaved
from workloads.toploc.proof import build_proofs_batch as _build_proofs

Cheat = Literal["none", "weights", "noise", "noise-unproven", "other-prompt", "skip", "forge-token"]
CHEATS: tuple[str, ...] = (
    "none",
    "weights",
    "noise",
    "noise-unproven",
    "other-prompt",
    "skip",
    "forge-token",
)


@dataclass
class BatchRequest:
    """What the driver (stage 0) is asked to generate."""

    prompts: list[list[int]]
    seeds: list[int]
    max_new_tokens: int
    temperature: float


@dataclass
class StageOutput:
    """What one member made of one batch: its proofs, and (stage 0 and the last) the tokens."""

    index: int
    layers: tuple[int, int]
    proofs: list[bytes]
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    seconds: float = 0.0
    proof_seconds: float = 0.0  # of `seconds`: building its proofs and checking the sender's
    bytes_sent: int = 0


class Member:
    """Runs `stage` in a group over `link`. `cheat` (tests and the demo only) makes it dishonest."""

    def __init__(self, stage: Stage, link: MemberLink | None, eos_token_id: int, pad_token_id: int,
                 cheat: Cheat = "none") -> None:  # fmt: skip
        self.stage, self.link = stage, link
        self.eos, self.pad = eos_token_id, pad_token_id
        self.cheat = cheat
        self.plan = stage.plan
        self._proof_seconds = 0.0
        if cheat == "weights":
            _perturb(stage)

    def run_batch(self, request: BatchRequest | None = None) -> StageOutput:
        started = time.perf_counter()
        self._proof_seconds = 0.0
        if self.plan.first:
            if request is None:
                raise ValueError("stage 0 drives the batch: it needs the request")
            out = self._drive(request)
        else:
            out = self._follow()
        out.seconds = time.perf_counter() - started
        out.proof_seconds = self._proof_seconds
        out.bytes_sent = self.link.bytes_sent if self.link else 0
        return out

    # ---- stage 0 ------------------------------------------------------------------------------

    def _drive(self, req: BatchRequest) -> StageOutput:
        batch, width = len(req.prompts), max(map(len, req.prompts))
        ids = torch.full((batch, width), self.pad, dtype=torch.long)
        for i, p in enumerate(req.prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
        lengths = [len(p) for p in req.prompts]
        shape: dict[str, Any] = {
            "lengths": lengths, "seeds": list(req.seeds), "max_new_tokens": req.max_new_tokens,
            "temperature": req.temperature,
        }  # fmt: skip
        mask, pos = _mask_positions(lengths, width)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        done = [False] * batch
        sent = _Sent(lengths, width)
        cache: Any = None
        x = ids
        for step in range(req.max_new_tokens):
            out, cache = self._forward(x, mask, pos, cache)
            if self.plan.last:  # a group of one
                sent.add(step, out)
                tok, lp = self._sample(out[:, -1], req.seeds, step, req.temperature)
            else:
                payload = self._tamper(out)
                sent.add(step, payload if self.cheat != "noise-unproven" else out)
                assert self.link is not None
                self.link.send({"kind": "act", "step": step, **(shape if step == 0 else {})}, payload)
                frame = self.link.recv("tok")
                if frame.header["kind"] == "end" or frame.header.get("step") != step:
                    raise MemberMisbehaved(
                        self.link.prev, f"tokens of step {frame.header.get('step')} at {step}"
                    )
                tok = torch.tensor(frame.header["tokens"], dtype=torch.long)
                lp = torch.tensor(frame.header["logprobs"], dtype=torch.float32)
                if tok.shape != (batch,) or lp.shape != (batch,):
                    raise MemberMisbehaved(self.link.prev, f"{tuple(tok.shape)} tokens for {batch} rows")
            for i in range(batch):
                if not done[i]:
                    tokens[i].append(int(tok[i]))
                    logprobs[i].append(float(lp[i]))
                    done[i] = int(tok[i]) == self.eos
            if all(done) or step == req.max_new_tokens - 1:
                break
            x = torch.where(torch.tensor(done), torch.tensor(self.pad), tok).view(-1, 1)
            mask, pos = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype)], dim=1), pos[:, -1:] + 1
        out_lengths = [len(t) for t in tokens]
        if self.plan.last:
            proofs = self._prove(sent.final(out_lengths)) if sent.rows else []
        else:
            assert self.link is not None
            proofs = self._prove(sent.rows_for(out_lengths))
            self.link.send({"kind": "end", "lengths": out_lengths})
            self.link.send({"kind": "proofs", "proofs": [p.hex() for p in proofs]})
        return StageOutput(self.plan.index, (self.plan.layers.start, self.plan.layers.stop), proofs, tokens,
                           logprobs, [bool(t and t[-1] == self.eos) for t in tokens])  # fmt: skip

    # ---- stages 1..n-1 ------------------------------------------------------------------------

    def _follow(self) -> StageOutput:
        assert self.link is not None
        link = self.link
        first = link.recv("act")
        if first.header["kind"] != "act" or first.header.get("step") != 0 or first.tensor is None:
            raise MemberMisbehaved(link.prev, "a batch must start with step 0's activations")
        shape = {k: first.header[k] for k in ("lengths", "seeds", "max_new_tokens", "temperature")}
        lengths, seeds = list(shape["lengths"]), list(shape["seeds"])
        batch, width = len(lengths), int(first.tensor.shape[1])
        if first.tensor.shape != (batch, width, self.stage.hidden_size) or len(seeds) != batch:
            raise MemberMisbehaved(link.prev, f"activations of shape {tuple(first.tensor.shape)}")
        mask, pos = _mask_positions(lengths, width)
        received, sent = _Sent(lengths, width), _Sent(lengths, width)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        done = [False] * batch
        cache: Any = None
        frame, step = first, 0
        while frame.header["kind"] == "act":
            x = frame.tensor
            if frame.header.get("step") != step or x is None or x.shape[0] != batch:
                raise MemberMisbehaved(
                    link.prev, f"activations of step {frame.header.get('step')} at step {step}"
                )
            received.add(step, x)
            out, cache = self._forward(x, mask, pos, cache)
            if self.plan.last:
                sent.add(step, out)
                tok, lp = self._sample(out[:, -1], seeds, step, float(shape["temperature"]))
                for i in range(batch):
                    if not done[i]:
                        tokens[i].append(int(tok[i]))
                        logprobs[i].append(float(lp[i]))
                        done[i] = int(tok[i]) == self.eos
                link.send({"kind": "tok", "step": step, "tokens": tok.tolist(), "logprobs": lp.tolist()})
            else:
                payload = self._tamper(out)
                sent.add(step, payload if self.cheat != "noise-unproven" else out)
                link.send({"kind": "act", "step": step, **(shape if step == 0 else {})}, payload)
            frame = link.recv("act")
            step += 1
            mask, pos = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype)], dim=1), pos[:, -1:] + 1
        out_lengths = list(frame.header.get("lengths") or [])
        if len(out_lengths) != batch or not all(isinstance(n, int) and 1 <= n <= step for n in out_lengths):
            raise MemberMisbehaved(link.prev, f"an end frame with lengths {out_lengths[:8]}")
        claimed = link.recv("proofs")
        theirs = [bytes.fromhex(p) for p in claimed.header.get("proofs", [])]
        if theirs != self._prove(received.rows_for(out_lengths)):
            raise MemberMisbehaved(link.prev, "its proofs are not those of the activations it sent")
        if self.plan.last:
            proofs = self._prove(sent.final(out_lengths))
        else:
            proofs = self._prove(sent.rows_for(out_lengths))
            link.send({"kind": "end", "lengths": out_lengths})
            link.send({"kind": "proofs", "proofs": [p.hex() for p in proofs]})
        return StageOutput(self.plan.index, (self.plan.layers.start, self.plan.layers.stop), proofs, tokens,
                           logprobs, [bool(t and t[-1] == self.eos) for t in tokens])  # fmt: skip

    def _prove(self, hiddens: list[torch.Tensor]) -> list[bytes]:
        t0 = time.perf_counter()
        try:
            return _build_proofs(hiddens)
        finally:
            self._proof_seconds += time.perf_counter() - t0

    # ---- sampling and cheats -------------------------------------------------------------------

    def _forward(
        self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        out, cache = self.stage.forward(x, mask, pos, cache)
        if self.cheat == "skip":  # its layers skipped: what came in goes out (embedded / normed)
            decoder = self.stage.model.model
            with torch.inference_mode():
                if self.plan.first:
                    out = decoder.embed_tokens(x)
                elif self.plan.last:
                    out = decoder.norm(x)
                else:
                    out = x
        return out, cache

    def _sample(self, hidden_last: torch.Tensor, seeds: list[int], step: int, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        logits = self.stage.logits(hidden_last)
        if self.cheat == "forge-token":  # greedy instead of the seed's Gumbel draw
            tok = logits.float().argmax(dim=-1)
            return tok, sampler.token_logprobs(logits, tok, temperature)
        return sampler.sample(logits, seeds, [step] * len(seeds), temperature)

    def _tamper(self, out: torch.Tensor) -> torch.Tensor:
        """What a dishonest non-last member forwards instead of its output."""
        if self.cheat in ("noise", "noise-unproven"):
            g = torch.Generator().manual_seed(7)
            return (out.float() + torch.randn(out.shape, generator=g) * 0.05 * out.float().std()).to(
                out.dtype
            )
        if self.cheat == "other-prompt" and out.shape[0] > 1:
            return out.roll(1, dims=0)
        return out


class _Sent:
    """Activations one side of a link saw, kept per row at the positions proofs commit to."""

    def __init__(self, lengths: list[int], width: int) -> None:
        self.lengths, self.width = lengths, width
        self.prompt: torch.Tensor | None = None  # [B, W, H] of step 0
        self.steps: list[torch.Tensor] = []  # [B, H] of steps 1..

    @property
    def rows(self) -> bool:
        return self.prompt is not None

    def add(self, step: int, tensor: torch.Tensor) -> None:
        if step == 0:
            self.prompt = tensor.detach().clone()
        else:
            self.steps.append(tensor[:, -1].detach().clone())

    def _decode(self, i: int, count: int) -> torch.Tensor:
        assert self.prompt is not None
        if count <= 0:
            return self.prompt.new_zeros((0, self.prompt.shape[-1]))
        return torch.stack([s[i] for s in self.steps[:count]])

    def rows_for(self, out_lengths: list[int]) -> list[torch.Tensor]:
        """Per row: every real prompt position, then the positions of its fed output tokens."""
        assert self.prompt is not None
        return [torch.cat([self.prompt[i, self.width - n :], self._decode(i, m - 1)])
                for i, (n, m) in enumerate(zip(self.lengths, out_lengths, strict=True))]  # fmt: skip

    def final(self, out_lengths: list[int]) -> list[torch.Tensor]:
        """Per row: the decode positions only (a single node's TOPLOC proof)."""
        return [self._decode(i, m - 1) for i, m in enumerate(out_lengths)]


def _mask_positions(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    return mask, (mask.cumsum(-1) - 1).clamp_min(0)


def _perturb(stage: Stage, scale: float = 1e-2, seed: int = 3) -> None:
    """N(0, scale) on one matrix of the member's own layers."""
    weight = next(p for n, p in stage.model.named_parameters() if n.endswith("q_proj.weight"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.add_((torch.randn(weight.shape, generator=g) * scale).to(weight.dtype))
