"""One checkpoint per trainer step: `step_<N>.safetensors` (the weights, what workers load),
`step_<N>.safetensors.sha256` (sidecar), `step_<N>.json` (manifest: step, parent step, config hash,
metrics, sha256) and `step_<N>.state.pt` (optimizer, consumed files, RNG: exact resume). A trainer
sharded over several processes (workloads/trainer/sharded.py) writes the same consolidated weights,
and its optimizer state as `step_<N>.optimizer/`, one shard a rank (torch.distributed.checkpoint),
instead of inside `state.pt`.

Files are written to a temporary name and renamed, manifest last, so a crash mid-write leaves the
previous step as the newest complete one; a restart resumes from it without repeating or skipping a
step. Manifests stay (the reward curve). Weights and state stay for the last `keep` steps; with a
vote window the weights (not the optimizer state: only a resume reads it, from the newest) also stay
for every step whose files validators may still judge (`CheckpointDir.kept_until`): honest files may
name step s's checkpoint until the trainer passes step s + 2 x async level, and may be judged until
that time plus the window; after that a step's weights go. Step 0, the base model, is never written
here.

torch, safetensors and transformers are imported where weights are saved or loaded: reading the
manifests (the devnet's demo follows the reward curve from them) costs no torch import, which on a busy
machine took long enough for a whole slash-and-eject to pass unseen.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from intellect.digests import sha256_file

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


class Manifest(BaseModel):
    step: int = Field(ge=1)
    parent_step: int = Field(ge=0)
    sha256: str
    config_hash: str
    created_at: float
    metrics: dict[str, float] = Field(default_factory=dict)
    files: list[str] = Field(default_factory=list, description="rollout files (sha256) trained on")


# How long after the trainer passed a step a submission may still count as made at that step: the
# validators' clock grace (validator/watcher.py CLOCK_GRACE_SECONDS, 30 s: a file is "behind" only
# against the step in force that long before its block) and a margin for the chain's and the
# trainer's clocks.
SUBMISSION_GRACE_SECONDS = 60.0


class CheckpointDir:
    """`keep`: the newest steps whose weights always stay. `vote_window` (seconds; None: `keep` alone,
    what a reader of the folder passes): also every step whose files may still be judged stays, see
    `kept_until`; `async_level`: the trainer's."""

    def __init__(
        self, root: Path, keep: int = 5, *, vote_window: float | None = None, async_level: int = 0
    ) -> None:
        self.root = root
        self.keep = max(1, keep)
        self.vote_window = vote_window
        self.async_level = max(0, async_level)
        root.mkdir(parents=True, exist_ok=True)

    def weights(self, step: int) -> Path:
        return self.root / f"step_{step}.safetensors"

    def manifest_path(self, step: int) -> Path:
        return self.root / f"step_{step}.json"

    def state_path(self, step: int) -> Path:
        return self.root / f"step_{step}.state.pt"

    def optimizer_dir(self, step: int) -> Path:
        """A sharded trainer's optimizer state (torch.distributed.checkpoint: one file a rank)."""
        return self.root / f"step_{step}.optimizer"

    def all_steps(self) -> list[int]:
        """Every step ever written (manifests are kept for the reward curve), oldest first."""
        return sorted(int(p.stem.split("_")[1]) for p in self.root.glob("step_*.json"))

    def steps(self) -> list[int]:
        """Steps whose weights are on disk (the manifest is written last: a step with one is complete),
        oldest first: what the step counter serves."""
        return [s for s in self.all_steps() if self.weights(s).exists()]

    def resumable(self) -> list[int]:
        """Steps a restart can resume from (weights and optimizer state: the newest `keep`), oldest first."""
        return [s for s in self.steps() if self.state_path(s).exists()]

    def step_at(self, when: float) -> int:
        """The trainer's step in force at unix time `when`: the newest step whose checkpoint was
        written by then (0, the base model, before the first). Manifests are kept for every step."""
        steps = self.all_steps()  # written in order, so their times rise: a bisection reads log2(n)
        low, high = 0, len(steps)  # manifests, not all of them, per question (a validator asks often)
        while low < high:
            middle = (low + high) // 2
            if self.manifest(steps[middle]).created_at <= when:
                low = middle + 1
            else:
                high = middle
        return steps[low - 1] if low else 0

    def manifest(self, step: int) -> Manifest:
        return Manifest.model_validate_json(self.manifest_path(step).read_text())

    def save(
        self, model: PreTrainedModel, step: int, parent: int, config_hash: str, metrics: dict[str, float],
        files: list[str], state: dict[str, Any],
    ) -> Manifest:  # fmt: skip
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        tensors = {k: v.detach() for k, v in model.state_dict().items()}
        return self.save_tensors(tensors, tied, step, parent, config_hash, metrics, files, state)

    def save_tensors(
        self, tensors: dict[str, torch.Tensor], tied: bool, step: int, parent: int, config_hash: str,
        metrics: dict[str, float], files: list[str], state: dict[str, Any],
    ) -> Manifest:  # fmt: skip
        """Publish step `step`: the weights (a full state dict; a sharded trainer's rank 0 passes the one
        it gathered), their sidecar, the resume state and, last, the manifest that makes the step seen."""
        import torch
        from safetensors.torch import save_file

        weights = self.weights(step)
        tmp = weights.with_suffix(".tmp")
        tensors = {k: v.to("cpu").contiguous() for k, v in tensors.items()}
        if tied:
            tensors.pop("lm_head.weight", None)  # tied: safetensors refuses shared storage
        save_file(tensors, str(tmp), metadata={"step": str(step)})
        tmp.replace(weights)
        sha = sha256_file(weights)
        (self.root / f"{weights.name}.sha256").write_text(f"{sha}  {weights.name}\n")
        state_tmp = self.state_path(step).with_suffix(".tmp")
        torch.save(state, state_tmp)
        state_tmp.replace(self.state_path(step))
        manifest = Manifest(
            step=step, parent_step=parent, sha256=sha, config_hash=config_hash, created_at=time.time(),
            metrics=metrics, files=files,
        )  # fmt: skip
        tmp_manifest = self.manifest_path(step).with_suffix(".tmp")
        tmp_manifest.write_text(manifest.model_dump_json(indent=2))
        tmp_manifest.replace(self.manifest_path(step))
        self.prune()
        return manifest

    def load_weights(self, model: PreTrainedModel, step: int) -> None:
        from safetensors.torch import load_file

        state = load_file(str(self.weights(step)))
        model.load_state_dict(state, strict=False)
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()

    def load_state(self, step: int) -> dict[str, Any]:
        import torch

        state: dict[str, Any] = torch.load(self.state_path(step), weights_only=False)
        return state

    def history(self) -> list[dict[str, float]]:
        """Metrics of every step since the start, also of pruned ones: the whole reward curve."""
        return [{"step": m.step, **m.metrics} for m in (self.manifest(s) for s in self.all_steps())]

    def kept_until(self, step: int) -> float:
        """Unix time until which validators may still need step `step`'s weights (inf: no end yet).

        An honest file generated for step t names a checkpoint in [t - async level, t], and is paid
        only while the trainer is at most async level steps past t at its submission (files further
        behind are soft-invalidated whatever the checkpoint); so files naming step s's checkpoint may
        be submitted until the trainer writes step s + 2 x async level + 1 (plus the clock grace), and
        judged until the vote window has passed after that. Until that step is written: inf."""
        if self.vote_window is None:
            return 0.0
        passed = step + 2 * self.async_level + 1
        if not self.manifest_path(passed).exists():
            return float("inf")
        return self.manifest(passed).created_at + SUBMISSION_GRACE_SECONDS + self.vote_window

    def prune(self, now: float | None = None) -> list[int]:
        """Steps older than the newest `keep` lose their optimizer state (only a resume reads it, from
        the newest), and their weights too once their files can no longer be judged (`kept_until`
        passed); returns the steps whose weights went. Called after each save, and by a trainer that
        serves on after its last step. The small manifest stays."""
        now = time.time() if now is None else now
        older = self.steps()[: -self.keep]
        for step in older:
            self.state_path(step).unlink(missing_ok=True)
            shutil.rmtree(self.optimizer_dir(step), ignore_errors=True)
        dropped = [s for s in older if self.kept_until(s) <= now]
        for step in dropped:
            self.weights(step).unlink(missing_ok=True)
            (self.root / f"step_{step}.safetensors.sha256").unlink(missing_ok=True)
        return dropped


def config_hash(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
