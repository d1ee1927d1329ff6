"""The attack suite: every way of cheating on a rollout file the issue lists ends in `invalidate`
with the reason naming the check that caught it, and honest files are accepted.

Honest files come from the real inference workload (tiny model, bf16); each attack is what a
cheating worker would write instead: a file made with another model or dtype, or an honest file
edited after the fact."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from intellect.wire.verdicts import Submission, Verdict
from intellect.workloads import MemorySeenStore
from workloads.inference.generate import group_advantages
from workloads.inference.judge.file_judge import InferenceJudge
from workloads.inference.settings import InferenceSettings
from workloads.inference.task import TaskSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model.loading import ModelCheckpoints
from workloads.rollouts import Rollout, read_rollouts, write_rollouts

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"
OTHER = "0x1111111111111111111111111111111111111111"
TASK = TaskSettings(batch_size=4, n=4, max_new_tokens=16, target_lengths=[8, 12])
EOS = 1


def settings(out: Path, node: str = NODE, **kw: object) -> InferenceSettings:
    return InferenceSettings(
        node_address=node, output_dir=out, batch_size=TASK.batch_size, n=TASK.n,
        max_new_tokens=TASK.max_new_tokens, target_lengths=TASK.target_lengths, max_batches=1, **kw,
    )  # fmt: skip


def generate(out: Path, batches: int = 1, **kw: object) -> list[Path]:
    workload = InferenceWorkload(settings(out, **kw))
    return [Path(workload.run_batch().path) for _ in range(batches)]  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("attacks")
    honest = generate(root / "honest", batches=4)
    return {"root": root, "honest": honest}


def judge(*paths: Path, task: TaskSettings = TASK, **submission: object) -> list[Verdict]:
    """A fresh validator (its own duplicate memory) judging `paths` in order."""
    pipeline = InferenceJudge(task, MemorySeenStore(), ModelCheckpoints(task.model))
    sub = Submission(node=submission.pop("node", NODE), **submission)  # type: ignore[arg-type]
    follow_on(pipeline, paths[0], sub.node or NODE)
    return [pipeline.judge(p, sub) for p in paths]


def follow_on(pipeline: InferenceJudge, path: Path, node: str) -> None:
    """As if the node's earlier batches had been judged already (the counters must follow each other
    over the task: tests/workloads/judge/test_selection.py tests that order itself)."""
    try:
        _, info = read_rollouts(path)
    except ValueError:
        return
    key = f"{node.lower()}#{info.task_id}"
    for counter in range(1, info.batch_counter):
        pipeline.windows.push(None, key, {"file": f"earlier file {counter}", "counter": counter}, keep=16)


def rewrite(src: Path, dst: Path, rows: list[Rollout] | None = None, **info_changes: object) -> Path:
    original, info = read_rollouts(src)
    write_rollouts(dst, original if rows is None else rows, info.model_copy(update=info_changes))
    return dst


def edited(world: dict[str, object], name: str, edit) -> Path:  # noqa: ANN001
    src = world["honest"][0]  # type: ignore[index]
    rows, info = read_rollouts(src)
    new_rows = edit([r.model_copy() for r in rows])
    assert new_rows != rows, f"the {name} attack changed nothing: the test would prove nothing"
    dst = Path(world["root"]) / f"{name}.parquet"  # type: ignore[arg-type]
    write_rollouts(dst, new_rows, info)
    return dst


def assert_caught(verdict: Verdict, words: str) -> None:
    assert verdict.verdict == "invalidate", verdict
    assert any(words in r for r in verdict.reasons), verdict.reasons


def with_consistent_rewards(rows: list[Rollout]) -> list[Rollout]:
    """A careful forger recomputes rewards and advantages so the file is self-consistent."""
    rewards = np.array([r.task_rewards - r.length_penalties for r in rows])
    adv = np.concatenate([group_advantages(rewards[g : g + TASK.n]) for g in range(0, len(rows), TASK.n)])
    return [
        r.model_copy(update={"rewards": float(w), "advantages": float(a)})
        for r, w, a in zip(rows, rewards, adv, strict=True)
    ]


# ---- honest -----------------------------------------------------------------------------------------


def test_honest_files_are_accepted(world) -> None:
    verdicts = judge(*world["honest"], work_units=None)
    assert [v.verdict for v in verdicts] == ["accept"] * 4, [v.reasons for v in verdicts]
    assert all(v.rows == 16 and v.tokens > 0 for v in verdicts)


def test_honest_file_with_chain_facts_is_accepted(world) -> None:
    path = world["honest"][0]
    rows, _ = read_rollouts(path)
    tokens = sum(len(r.output_tokens) for r in rows)
    from intellect.digests import sha256_file as sha256_of

    [v] = judge(path, work_units=tokens, work_key="0x" + sha256_of(path), trainer_step=1)
    assert v.verdict == "accept", v.reasons


# ---- another model or dtype ------------------------------------------------------------------------


def _model_attack(world, name: str, mutate) -> Path:  # noqa: ANN001
    out = Path(world["root"]) / name
    workload = InferenceWorkload(settings(out))
    mutate(workload)
    return Path(workload.run_batch().path)  # type: ignore[union-attr]


def test_wrong_model(world) -> None:
    def other_model(w: InferenceWorkload) -> None:
        torch.manual_seed(7)
        with torch.no_grad():
            for p in w.model.parameters():  # type: ignore[union-attr]
                p.mul_(1.5).add_(torch.randn_like(p.float()).to(p.dtype) * 0.05)

    [v] = judge(_model_attack(world, "wrong-model", other_model))
    assert_caught(v, "")
    assert any(k in " ".join(v.reasons) for k in ("toploc", "sampling", "logprobs"))


def test_perturbed_weights(world) -> None:
    def perturb(w: InferenceWorkload) -> None:
        torch.manual_seed(3)
        q = w.model.model.layers[0].self_attn.q_proj.weight  # type: ignore[union-attr]
        with torch.no_grad():
            q.add_(torch.randn_like(q.float()).to(q.dtype) * 1e-2)

    [v] = judge(_model_attack(world, "perturbed", perturb))
    assert_caught(v, "toploc")


def test_fp32_inference(world) -> None:
    [v] = judge(generate(Path(world["root"]) / "fp32", dtype="float32")[0])
    assert_caught(v, "toploc")


# ---- outputs edited --------------------------------------------------------------------------------


def test_truncated_output(world) -> None:
    def cut(rows):  # noqa: ANN001, ANN202
        return with_consistent_rewards(
            [
                r.model_copy(
                    update={"output_tokens": r.output_tokens[:2], "output_logprobs": r.output_logprobs[:2]}
                )
                if len(r.output_tokens) > 2
                else r
                for r in rows
            ]
        )

    path = edited(world, "truncated", cut)
    assert read_rollouts(path)[0] != read_rollouts(world["honest"][0])[0]
    [v] = judge(path)
    assert v.verdict == "invalidate" and any(w in " ".join(v.reasons) for w in ("termination", "rewards")), v


def test_fake_early_eos(world) -> None:
    def early(rows):  # noqa: ANN001, ANN202
        out = []
        for r in rows:
            if len(r.output_tokens) > 2 and r.output_tokens[1] != EOS:
                toks = r.output_tokens[:1] + [EOS]
                r = r.model_copy(
                    update={"output_tokens": toks, "output_logprobs": r.output_logprobs[:1] + [-0.01]}
                )
            out.append(r)
        return out

    [v] = judge(edited(world, "early-eos", early))
    assert v.verdict == "invalidate"
    assert any(w in " ".join(v.reasons) for w in ("sampling", "EOS", "rewards", "toploc")), v.reasons


def test_tokens_after_eos(world) -> None:
    def after(rows):  # noqa: ANN001, ANN202
        r0 = rows[0]
        toks = [EOS] + r0.output_tokens[1:] if r0.output_tokens[-1] != EOS else r0.output_tokens + [EOS]
        rows[0] = r0.model_copy(
            update={
                "output_tokens": toks[: TASK.max_new_tokens],
                "output_logprobs": ([-0.1] * len(toks))[: TASK.max_new_tokens],
            }
        )
        return rows

    [v] = judge(edited(world, "after-eos", after))
    assert v.verdict == "invalidate" and v.reasons


def test_forged_reward_on_wrong_answer(world) -> None:
    def forge(rows):  # noqa: ANN001, ANN202
        wrong = [i for i, r in enumerate(rows) if r.task_rewards == 0.0]
        assert wrong, "the tiny model gets some answers wrong"
        for i in wrong:
            rows[i] = rows[i].model_copy(update={"task_rewards": 1.0})
        return with_consistent_rewards(rows)

    [v] = judge(edited(world, "forged-reward", forge))
    assert_caught(v, "task reward the verifier does not give")


def test_forged_advantage(world) -> None:
    def forge(rows):  # noqa: ANN001, ANN202
        rows[0] = rows[0].model_copy(update={"advantages": rows[0].advantages + 1.0})
        return rows

    [v] = judge(edited(world, "forged-advantage", forge))
    assert_caught(v, "advantage the verifier does not give")


def test_inflated_work_units(world) -> None:
    path = world["honest"][0]
    rows, _ = read_rollouts(path)
    tokens = sum(len(r.output_tokens) for r in rows)
    [v] = judge(path, work_units=tokens * 10)
    assert_caught(v, "work units")


def test_swapped_proofs(world) -> None:
    def swap(rows):  # noqa: ANN001, ANN202
        long = [i for i, r in enumerate(rows) if len(r.output_tokens) > 2]
        a, b = long[0], long[1]
        pa, pb = rows[a].proofs, rows[b].proofs
        rows[a] = rows[a].model_copy(update={"proofs": pb})
        rows[b] = rows[b].model_copy(update={"proofs": pa})
        return rows

    [v] = judge(edited(world, "swapped-proofs", swap))
    assert_caught(v, "toploc")


def test_argmax_instead_of_gumbel(world) -> None:
    path = generate(Path(world["root"]) / "greedy", temperature=0.0)[0]
    rows, info = read_rollouts(path)
    forged = [r.model_copy(update={"temperature": TASK.temperature}) for r in rows]
    [v] = judge(rewrite(path, Path(world["root"]) / "greedy-claimed.parquet", forged))
    assert v.verdict == "invalidate"
    assert any(w in " ".join(v.reasons) for w in ("sampling", "logprobs")), v.reasons


def test_altered_logprobs(world) -> None:
    def shift(rows):  # noqa: ANN001, ANN202
        return [
            r.model_copy(update={"output_logprobs": [min(0.0, x + 0.2) for x in r.output_logprobs]})
            for r in rows
        ]

    [v] = judge(edited(world, "logprobs", shift))
    assert_caught(v, "logprobs")


def test_temperature_column_changed(world) -> None:
    def hot(rows):  # noqa: ANN001, ANN202
        return [r.model_copy(update={"temperature": 0.7}) for r in rows]

    [v] = judge(edited(world, "temperature", hot))
    assert_caught(v, "temperature other than the task's")


def test_max_new_tokens_rewritten_in_metadata(world) -> None:
    src = world["honest"][0]
    rows, info = read_rollouts(src)
    short = [
        r.model_copy(update={"output_tokens": r.output_tokens[:8], "output_logprobs": r.output_logprobs[:8]})
        for r in rows
    ]
    dst = rewrite(
        src, Path(world["root"]) / "short-meta.parquet", with_consistent_rewards(short), max_new_tokens=8
    )
    [v] = judge(dst)
    assert_caught(v, "max_new_tokens")


# ---- plans and seeds -------------------------------------------------------------------------------


def test_cherry_picked_prompts(world) -> None:
    from workloads.datasets import load_dataset
    from workloads.model.loading import load_tokenizer

    records, tok = load_dataset(TASK.dataset), load_tokenizer(TASK.model)
    easy = next(r for r in records if r.task_type == "sort")
    prompt = tok(easy.prompt)["input_ids"]

    def pick(rows):  # noqa: ANN001, ANN202
        return [
            r.model_copy(
                update={"input_tokens": prompt, "problem_id": easy.problem_id, "task_type": easy.task_type}
            )
            if i < TASK.n
            else r
            for i, r in enumerate(rows)
        ]

    [v] = judge(edited(world, "cherry", pick))
    assert_caught(v, "plan")


def test_another_nodes_seeds(world) -> None:
    theirs = generate(Path(world["root"]) / "other-node", node=OTHER)[0]
    [v] = judge(theirs, node=NODE)
    assert_caught(v, "plan")
    relabelled = rewrite(theirs, Path(world["root"]) / "relabelled.parquet", node_address=NODE)
    [v] = judge(relabelled, node=NODE)
    assert_caught(v, "seeds that are not the plan's")


def test_stale_step_beyond_async_level_is_not_paid_but_not_slashed(world) -> None:
    """A file whose step is behind the trainer's window at submission: not paid (soft), never slashed
    (the trainer may simply not have said which step was in force then)."""
    [v] = judge(world["honest"][0], trainer_step=TASK.async_level + 1)
    assert v.verdict == "soft_invalidate" and any("behind the trainer's window" in r for r in v.reasons), v


def test_behind_is_judged_at_submission_so_a_late_validator_pays_the_same(world) -> None:
    """Issue 37.4: a validator that reads the submission minutes late sees the trainer far ahead; it
    now judges "behind the window" against the step in force at the block's time
    (`trainer_step_before`, from the trainer's history: tests/trainer/test_step_at.py), so it pays the
    honest file as the timely validator does. Without that step it falls back to the step it read."""
    honest = world["honest"][0]
    [timely] = judge(honest, trainer_step=0, trainer_step_before=0)
    [late] = judge(honest, trainer_step=TASK.async_level + 5, trainer_step_before=0)
    assert timely.verdict == late.verdict == "accept", (timely.reasons, late.reasons)
    [unknown] = judge(honest, trainer_step=TASK.async_level + 5)
    assert unknown.verdict == "soft_invalidate"


def test_a_step_ahead_of_the_trainer_is_slashed(world) -> None:
    """The trainer's step only grows: a file for a step it had not reached at submission is the node's."""
    ahead = rewrite(world["honest"][0], Path(world["root"]) / "ahead.parquet", step=5)
    [v] = judge(ahead, trainer_step=1)
    assert_caught(v, "is ahead of the trainer's step 1")


def test_a_checkpoint_no_longer_to_be_had_is_soft(world) -> None:
    """A validator that fell behind the trainer's listing cannot fetch the checkpoint: not the node's
    fault (soft), where a checkpoint that does not match the trainer's file is (see below)."""
    class Gone(ModelCheckpoints):
        def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
            return None  # the trainer's window moved on before this validator fetched it

    path = world["honest"][0]
    pipeline = InferenceJudge(TASK, MemorySeenStore(), Gone(TASK.model))
    follow_on(pipeline, path, NODE)
    v = pipeline.judge(path, Submission(node=NODE))
    assert v.verdict == "soft_invalidate" and any("can be had" in r for r in v.reasons), v


def test_unknown_checkpoint_claimed(world) -> None:
    dst = rewrite(world["honest"][0], Path(world["root"]) / "ckpt.parquet", checkpoint_sha256="ab" * 32)
    [v] = judge(dst)
    assert_caught(v, "freshness")


# ---- duplicates ------------------------------------------------------------------------------------


def test_same_file_twice(world) -> None:
    first, second = judge(world["honest"][0], world["honest"][0])
    assert first.verdict == "accept"
    assert_caught(second, "already submitted")


def test_same_rows_reordered_under_a_new_hash(world) -> None:
    src = world["honest"][1]
    rows, _ = read_rollouts(src)
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    dst = rewrite(src, Path(world["root"]) / "reordered.parquet", shuffled)
    first, second = judge(src, dst)
    assert first.verdict == "accept"
    assert_caught(second, "duplicate")


def test_rows_doubled_within_a_file(world) -> None:
    def double(rows):  # noqa: ANN001, ANN202
        rows[1] = rows[0]
        return rows

    [v] = judge(edited(world, "doubled", double))
    assert_caught(v, "repeat earlier rows of the same file")


def test_rows_copied_from_an_accepted_file(world) -> None:
    a, b = world["honest"][2], world["honest"][3]
    rows_a, _ = read_rollouts(a)
    rows_b, info_b = read_rollouts(b)
    mixed = rows_a[: TASK.n] + rows_b[TASK.n :]
    dst = Path(world["root"]) / "copied.parquet"
    write_rollouts(dst, mixed, info_b)
    first, second = judge(a, dst)
    assert first.verdict == "accept"
    assert_caught(second, "already submitted in an earlier file")


def test_batch_counter_reused(world) -> None:
    src = world["honest"][0]
    again = generate(Path(world["root"]) / "again", temperature=TASK.temperature)[0]  # counter 1 again
    first, second = judge(src, again)
    assert first.verdict == "accept"
    assert_caught(second, "duplicate")


# ---- not a rollout file ----------------------------------------------------------------------------


def test_file_that_is_not_parquet(world) -> None:
    junk = Path(world["root"]) / "junk.parquet"
    junk.write_bytes(b"this is not a parquet file")
    [v] = judge(junk, work_units=123_456)
    assert_caught(v, "schema")


def test_sha256_not_the_work_key_is_soft(world) -> None:
    [v] = judge(world["honest"][0], work_key="0x" + "00" * 32)
    assert v.verdict == "soft_invalidate" and "work key" in v.reasons[0]


def test_two_tasks_of_one_pool_never_collide_and_a_file_is_bound_to_its_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on compose: a node that ran a one-batch task and then the RL task of the same pool made
    step 0, batch 1 twice; the validator called the second a duplicate and voted to slash an honest
    node. The task id now salts every plan, and keys the duplicate and counter memories."""
    files = {}
    for task_id in ("task-a", "task-b"):
        monkeypatch.setenv("INTELLECT_TASK_ID", task_id)
        [files[task_id]] = generate(tmp_path / task_id)
    infos = {t: read_rollouts(p)[1] for t, p in files.items()}
    made = [(i.step, i.batch_counter, i.task_id) for i in infos.values()]
    assert made == [(0, 1, "task-a"), (0, 1, "task-b")]
    rows = {t: read_rollouts(p)[0] for t, p in files.items()}
    assert [r.seed for r in rows["task-a"]] != [r.seed for r in rows["task-b"]]  # different plans
    seen = MemorySeenStore()  # one validator's memory across both tasks
    for task_id, path in files.items():
        pipeline = InferenceJudge(TASK, seen, ModelCheckpoints(TASK.model), task_id=task_id)
        verdict = pipeline.judge(path, Submission(node=NODE))
        assert verdict.verdict == "accept", (task_id, verdict.reasons)
    # A file of task-a uploaded for task-b (a node shopping among plans): bound to its own task.
    pipeline = InferenceJudge(TASK, MemorySeenStore(), ModelCheckpoints(TASK.model), task_id="task-b")
    verdict = pipeline.judge(files["task-a"], Submission(node=NODE))
    assert_caught(verdict, "planned for task task-a, uploaded for task task-b")
