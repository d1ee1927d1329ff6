"""What a group's batch is made of: the weights it is made with (`Policy`), what the driver is asked
(`BatchRequest`), what every member ends the batch holding (`GroupBundle`, the file's content) and what
one member made of it (`StageOutput`). The protocol that fills them is `member.py`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workloads.pipeline.commit import LinkRecord


@dataclass(frozen=True)
class Policy:
    """The weights a batch is made with: the trainer's step it was made for and the checkpoint (its step,
    0 = the base model, and the sha256 of its file). The driver picks it; it travels in the step-0
    header so every member loads that checkpoint's layers before running the batch."""

    step: int = 0
    checkpoint_step: int = 0
    checkpoint_sha256: str | None = None

    @property
    def weights(self) -> tuple[int, str | None]:
        """What a member loads: the checkpoint (a new trainer step alone changes nothing to load)."""
        return self.checkpoint_step, self.checkpoint_sha256

    def header(self) -> dict[str, Any]:
        return {"step": self.step, "checkpoint_step": self.checkpoint_step, "sha256": self.checkpoint_sha256}

    @classmethod
    def from_header(cls, header: Any) -> Policy:
        if not isinstance(header, dict):
            raise ValueError("a policy must be an object")
        step, checkpoint, sha = header.get("step"), header.get("checkpoint_step"), header.get("sha256")
        if not (isinstance(step, int) and isinstance(checkpoint, int) and 0 <= checkpoint <= step):
            raise ValueError(f"a policy of step {step!r} with checkpoint {checkpoint!r}")
        if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
            raise ValueError("a checkpoint sha256 that is not 64 hex digits")
        return cls(step, checkpoint, sha)


@dataclass
class BatchRequest:
    """What the driver (stage 0) is asked to generate."""

    prompts: list[list[int]]
    seeds: list[int]
    max_new_tokens: int
    temperature: float
    batch: int = 1  # its number in the task (named in every member's file)
    policy: Policy = field(default_factory=Policy)


@dataclass
class GroupBundle:
    """A group's batch as every member holds it at the end: what a validator judges."""

    members: list[str]  # node addresses, stage order
    prompts: list[list[int]]
    outputs: list[list[int]]
    logprobs: list[list[float]]
    seeds: list[int]
    temperature: float
    stage_proofs: list[list[bytes]]  # per stage, one proof per row
    policy: Policy = field(default_factory=Policy)
    links: list[LinkRecord] = field(default_factory=list)  # link k → k+1, k = 0..n-2 (`commit.py`)

    def header(self) -> dict[str, Any]:
        return {"kind": "bundle", "members": self.members, "prompts": self.prompts, "outputs": self.outputs,
                "logprobs": self.logprobs, "seeds": self.seeds, "temperature": self.temperature,
                "stage_proofs": [[p.hex() for p in stage] for stage in self.stage_proofs],
                "policy": self.policy.header(), "links": [r.header() for r in self.links]}  # fmt: skip

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> GroupBundle:
        return cls(list(header["members"]), header["prompts"], header["outputs"], header["logprobs"],
                   header["seeds"], float(header["temperature"]),
                   [[bytes.fromhex(p) for p in stage] for stage in header["stage_proofs"]],
                   Policy.from_header(header["policy"]),
                   [LinkRecord.from_header(r) for r in header.get("links") or []])  # fmt: skip


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
    started: float = 0.0  # wall clock at the batch's start here (batches in flight overlap)
    proof_seconds: float = 0.0  # of `seconds`: building its proofs and checking the sender's
    bytes_sent: int = 0
    trips: int = 0  # trips round the ring the batch took (steps / trips: tokens a trip, with a draft)
    bundle: GroupBundle | None = None
    batch: int = 1
    received_frames: list[list[bytes]] = field(default_factory=list)  # the batch's frames, as they came
    sent_frames: list[list[bytes]] = field(default_factory=list)  # ...and as this member sent them
