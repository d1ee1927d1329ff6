"""Checkpoints round-trip exactly, with a correct sha256 sidecar; only the last few weights are kept,
every step's manifest stays (the reward curve)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from workloads.model.loading import load_model, load_weights
from workloads.trainer.checkpoints import CheckpointDir


def test_round_trip_identical_logits_and_sidecar(tmp_path: Path) -> None:
    model = load_model("tiny", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    ckpts = CheckpointDir(tmp_path, keep=2)
    manifest = ckpts.save(model, 1, 0, "cfg", {"task_reward_mean": 0.5}, ["f1"], {"x": 1})
    weights = ckpts.weights(1)
    assert manifest.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert (tmp_path / "step_1.safetensors.sha256").read_text().split()[0] == manifest.sha256
    ids = torch.tensor([[5, 9, 12, 40, 7]])
    again = load_model("tiny", dtype=torch.float32)
    ckpts.load_weights(again, 1)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    # the inference side loads the same file into bf16 exactly as it would the trainer's weights
    bf16 = load_weights(load_model("tiny"), weights)
    ref = load_model("tiny")
    ref.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    with torch.no_grad():
        assert torch.equal(bf16(ids).logits, ref(ids).logits)
    for step in (2, 3):
        ckpts.save(model, step, step - 1, "cfg", {}, [], {})
    assert ckpts.steps() == [2, 3] and not weights.exists() and not ckpts.state_path(1).exists()
    # the reward curve keeps every step, also the pruned one
    assert [h["step"] for h in ckpts.history()] == [1, 2, 3]
    assert ckpts.history()[0]["task_reward_mean"] == 0.5
