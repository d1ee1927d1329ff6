"""One checkpoint per trainer step: `step_<N>.safetensors` (the weights, what workers load),
`step_<N>.safetensors.sha256` (sidecar), `step_<N>.json` (manifest: step, parent step, config hash,
metrics, sha256) and `step_<N>.state.pt` (optimizer, consumed files, RNG: exact resume).

Files are written to a temporary name and renamed, manifest last, so a crash mid-write leaves the
previous step as the newest complete one; a restart resumes from it without repeating or skipping a
step. Only the last `keep` steps' weights and state stay on disk;
manifests stay (the reward curve). Step 0, the base model, is never written here.

torch, safetensors and transformers are imported where weights are saved or loaded: reading the
manifests (the devnet's demo follows the reward curve from them) costs no torch import, which on a busy
machine took long enough for a whole slash-and-eject to pass unseen.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from intellect.digests import sha256_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Manifest(BaseModel):
    step: int = Field(ge=1)
    parent_step: int = Field(ge=0)
    sha256: str
    config_hash: str
    created_at: float
    metrics: dict[str, float] = Field(default_factory=dict)
    files: list[str] = Field(default_factory=list, description="rollout files (sha256) trained on")


class CheckpointDir:
    def __init__(self, root: Path, keep: int = 5) -> None:
        self.root = root
        self.keep = max(1, keep)
        root.mkdir(parents=True, exist_ok=True)

    def weights(self, step: int) -> Path:
        return self.root / f"step_{step}.safetensors"

    def manifest_path(self, step: int) -> Path:
        return self.root / f"step_{step}.json"

    def state_path(self, step: int) -> Path:
        return self.root / f"step_{step}.state.pt"

    def all_steps(self) -> list[int]:
        """Every step ever written (manifests are kept for the reward curve), oldest first."""
        return sorted(int(p.stem.split("_")[1]) for p in self.root.glob("step_*.json"))

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint on disk (manifest written last, weights kept), oldest first."""
        return [s for s in self.all_steps() if self.weights(s).exists() and self.state_path(s).exists()]

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
        import torch
        from safetensors.torch import save_file

        weights = self.weights(step)
        tmp = weights.with_suffix(".tmp")
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
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
        self._prune()
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

    def _prune(self) -> None:
        for step in self.steps()[: -self.keep]:  # weights and state go; the small manifest stays
            for path in (
                self.weights(step),
                self.state_path(step),
                self.root / f"step_{step}.safetensors.sha256",
            ):
                path.unlink(missing_ok=True)


def config_hash(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
