"""Group batches in an RL run: the driver follows the trainer's step, every member loads that step's
checkpoint for its stage, each member's file carries the rollout schema's rows (n completions per
prompt, rewards, advantages, the policy), the trainer reads a batch once, and the validator judges it
against the trainer's checkpoint: rewards recomputed, freshness checked. Real member processes, a real
HTTP trainer stand-in (its step counter and checkpoint files), the real judge."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_task import NODES, judge_env, run_group  # noqa: E402

from intellect.wire.verdicts import Submission  # noqa: E402
from intellect.workloads import MemorySeenStore  # noqa: E402
from tests.support.loopback import served_folder  # noqa: E402
from validator.checkpoints import TrainerCheckpoints  # noqa: E402
from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import completion_text  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer, load_weights  # noqa: E402
from workloads.pipeline.files import file_name, plan_group_batch, read_group_file  # noqa: E402
from workloads.pipeline.judge.file_judge import PipelineJudge  # noqa: E402
from workloads.pipeline.settings import PipelineSettings  # noqa: E402
from workloads.trainer.loop import read_batch  # noqa: E402
from workloads.verifiers import score  # noqa: E402

RL = {"batch_size": 2, "n": 2, "batches": 2, "max_new_tokens": 8, "target_lengths": [4],
      "length_penalty": 0.01, "async_level": 1, "poll_seconds": 0.2}  # fmt: skip


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP as the trainer serves its step counter and checkpoints."""
    with served_folder(tmp_path / "www") as url:
        yield tmp_path / "www", url


def publish(root: Path, url: str, step: int, scale: float) -> str:
    """Checkpoint `step` (the base weights × `scale`) with its sha256 sidecar, and the step counter
    listing it as the trainer does; returns its sha256."""
    state = {k: (v.float() * scale).to(torch.bfloat16).contiguous()
             for k, v in load_model("tiny").state_dict().items() if k != "lm_head.weight"}  # fmt: skip
    path = root / f"step_{step}.safetensors"
    save_file(state, str(path))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / f"step_{step}.safetensors.sha256").write_text(sha + "\n")
    listing = {str(step): {"url": f"{url}/step_{step}.safetensors", "sha256": sha}}
    (root / "step").write_text(json.dumps({"step": step, "checkpoints": listing}))
    return sha


def draws(weights: Path | None, prompts: list[list[int]], seeds: list[int]) -> list[list[int]]:
    """The tokens one node draws for these rows with these weights (base: None)."""
    model = load_model("tiny", dtype=torch.bfloat16)
    if weights is not None:
        load_weights(model, weights)
    tok = load_tokenizer("tiny")
    backend = TorchBackend(model, tok.eos_token_id, tok.pad_token_id)
    out = backend.generate(prompts, seeds, max_new_tokens=RL["max_new_tokens"], temperature=1.0,
                           capture_hidden=False)  # fmt: skip
    return [c.tokens for c in out]


@pytest.mark.slow
def test_a_group_follows_the_trainer_and_its_batches_are_rollouts(tmp_path: Path, trainer) -> None:  # noqa: ANN001
    root, url = trainer
    sha = publish(root, url, 1, 1.5)
    follow = {**RL, "step_url": f"{url}/step", "checkpoint_source": f"{url}/step_{{step}}.safetensors"}
    dirs = run_group(tmp_path, 2, follow)
    one, two = (read_group_file(dirs[i] / file_name(1, i)) for i in (0, 1))
    assert (one.step, one.checkpoint_step, one.checkpoint_sha256) == (1, 1, sha)
    assert two.policy == one.policy and two.outputs == one.outputs

    # n completions per prompt, the plan's prompts in order
    records, tok = load_dataset("reverse"), load_tokenizer("tiny")
    plan = plan_group_batch("task-1", "group-1", NODES[:2], 1, len(records), 2, 2, [4])
    assert one.prompts == [tok(records[i].prompt)["input_ids"] for i in plan.indexes for _ in range(2)]
    # every member ran the checkpoint's layers: the tokens are one node's draws with those weights,
    # not with the base model's
    assert one.outputs == draws(root / "step_1.safetensors", one.prompts, one.seeds)
    assert one.outputs != draws(None, one.prompts, one.seeds)
    # rewards as the single-node workload gives them
    for r, out in enumerate(one.outputs):
        record = records[plan.indexes[r // 2]]
        assert one.problem_ids[r] == record.problem_id and one.target_lengths[r] == 4
        assert one.task_rewards[r] == pytest.approx(score(record, completion_text(tok, out)))
        assert one.rewards[r] == pytest.approx(one.task_rewards[r] - 0.01 * abs(len(out) - 4))
    assert np.allclose([one.advantages[g] + one.advantages[g + 1] for g in (0, 2)], 0, atol=1e-5)

    # the trainer reads the batch once: stage 0's copy as rollout rows, the other member's not at all
    read = read_batch(dirs[0] / file_name(1, 0))
    assert read is not None
    rows, info = read
    assert len(rows) == 4 and info.group_size == 2 and (info.step, info.checkpoint_step) == (1, 1)
    assert [r.output_tokens for r in rows] == one.outputs and rows[0].rewards == pytest.approx(one.rewards[0])
    assert read_batch(dirs[1] / file_name(1, 1)) is None

    # the validator judges against the trainer's checkpoint
    seen = MemorySeenStore()
    checkpoints = TrainerCheckpoints(f"{url}/step", tmp_path / "v" / "checkpoints")  # the host's
    env = dataclasses.replace(judge_env(tmp_path / "v", seen), checkpoints=checkpoints)
    judge = PipelineJudge(PipelineSettings(**follow), env)

    def verdict(path: Path, node: str, trainer_step: int = 1) -> tuple[str, str]:
        got = judge.judge(path, Submission(node=node, pool_id=1, trainer_step=trainer_step))
        return got.verdict, " ".join(got.reasons)

    assert verdict(dirs[0] / file_name(1, 0), NODES[0]) == ("accept", "")
    assert verdict(dirs[1] / file_name(1, 1), NODES[1]) == ("accept", "")
    # a member that lies about its rewards in its own file: its file alone
    data = json.loads((dirs[1] / file_name(2, 1)).read_text())
    data["task_rewards"] = [1.0] * len(data["task_rewards"])
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(data))
    kind, why = verdict(forged, NODES[1])
    assert kind == "invalidate" and "rewards" in why, why
    # a batch made for a step ahead of the trainer's at submission
    kind, why = verdict(dirs[0] / file_name(2, 0), NODES[0], trainer_step=0)
    assert kind == "invalidate" and "freshness" in why, why
