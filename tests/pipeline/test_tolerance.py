"""The replay's tolerance per model (issue 55, `workloads/pipeline/judge/tolerance.py`): honest groups are
never guilty under the file rules, at any batch size; members that save compute (their layers in
int8, a skipped layer) or shift what they forward (+1 % of each position's RMS, the room the per-position
rule left) are, on one file of 8 rows × 24 tokens; and the limits are the model's record's.

Groups run as threads over real links (`run_thread_group`), as in test_blame.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from intellect.workloads import MemorySeenStore, ValidatorEnv
from tests.pipeline.tiny import tiny_batch
from workloads.inference.judge import calibration
from workloads.inference.judge.calibration import CalibrationRecord, limits_of, resolve_limits
from workloads.pipeline.bundle import BatchRequest
from workloads.pipeline.group import GroupRun, run_thread_group
from workloads.pipeline.judge.replay import MemberVerdict, judge_member
from workloads.pipeline.judge.tolerance import TINY_FORWARD, Differences, ForwardLimits, forward_verdict
from workloads.pipeline.stages import plan_stages

pytestmark = pytest.mark.slow  # ~12 s of groups and replays: the full suite, not the fast tier


@pytest.fixture(scope="module")
def tiny():  # noqa: ANN201
    return tiny_batch(24)


def judge(tiny, run: GroupRun, members: int, stage: int,  # noqa: ANN001
          limits: ForwardLimits = TINY_FORWARD) -> MemberVerdict:  # fmt: skip
    tok, model, _ = tiny
    assert run.ok, run.errors
    out = run.outputs[stage]
    return judge_member(model, plan_stages("tiny", members), stage, out.bundle, out.received_frames,
                        out.sent_frames, task_id="local", group_id="local", batch=1, limits=limits,
                        eos=int(tok.eos_token_id), pad=int(tok.pad_token_id))  # fmt: skip


def one_row(tiny, tokens: int) -> BatchRequest:  # noqa: ANN001
    request = tiny[2]
    return BatchRequest(request.prompts[:1], request.seeds[:1], tokens, 1.0)


def test_the_shipped_defaults_are_the_tiny_records() -> None:
    """One set of figures: the tiny model's record states what a model without one falls back to."""
    limits = resolve_limits("tiny", {})
    assert limits.calibrated("pipeline")
    assert ForwardLimits.from_record(limits.forward) == TINY_FORWARD


@pytest.mark.parametrize("members", [2, 3])
def test_honest_groups_are_never_guilty_at_any_batch_size(tiny, members: int) -> None:  # noqa: ANN001
    for request in (tiny[2], one_row(tiny, 24), one_row(tiny, 1)):
        run = run_thread_group(members, request)
        for stage in range(members - 1):
            verdict = judge(tiny, run, members, stage)
            assert not verdict.guilty and verdict.proven, verdict.reasons


@pytest.mark.parametrize(("members", "stage"), [(2, 0), (3, 1)])
def test_a_one_percent_bias_is_caught_on_one_file(tiny, members: int, stage: int) -> None:  # noqa: ANN001
    """+1 % of each position's RMS: every position under the per-position limit (5 %), the offset 0.01."""
    run = run_thread_group(members, tiny[2], cheats={stage: "bias"})
    verdict = judge(tiny, run, members, stage)
    assert verdict.guilty and verdict.worst < TINY_FORWARD.position, verdict.reasons
    assert "offset" in verdict.reasons[0]
    assert not judge(tiny, run, members, stage + 1).guilty  # the next member, fed the shifted values


@pytest.mark.parametrize("cheat", ["int8", "skip-layer"])
def test_a_member_that_saves_compute_is_caught_on_one_file(tiny, cheat: str) -> None:  # noqa: ANN001
    run = run_thread_group(2, tiny[2], cheats={0: cheat})
    verdict = judge(tiny, run, 2, 0)
    assert verdict.guilty, (cheat, verdict.worst)


def test_the_record_s_limits_decide(tiny) -> None:  # noqa: ANN001
    """A record stating looser file limits clears the bias its tiny figures catch: the verdict follows
    the record, through `Limits.forward`."""
    shipped = resolve_limits("tiny", {}).record
    assert shipped is not None
    loose = dict(shipped.pipeline["limits"], mean=1.0, offset=1.0)
    record = shipped.model_copy(update={"pipeline": {**shipped.pipeline, "limits": loose}})
    limits = ForwardLimits.from_record(limits_of(record, {}).forward)
    assert limits.offset == 1.0
    run = run_thread_group(2, tiny[2], cheats={0: "bias"})
    assert judge(tiny, run, 2, 0).guilty
    assert not judge(tiny, run, 2, 0, limits).guilty
    unnamed = record.model_copy(update={"workloads": ["inference"]})  # not calibrated for this workload
    assert limits_of(unnamed, {}).forward is None


def test_a_model_without_a_pipeline_record_is_judged_by_tiny_s_per_position_rules_and_never_slashed(
    tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    from workloads.pipeline.judge.file_judge import PipelineJudge
    from workloads.pipeline.settings import PipelineSettings

    folder = tmp_path / "records"
    folder.mkdir()
    shipped = json.loads((calibration.SHIPPED / "tiny.json").read_text())
    shipped["workloads"], shipped["pipeline"] = ["inference"], {}
    (folder / "tiny.json").write_text(json.dumps(shipped))
    monkeypatch.setattr(calibration, "record_folders", lambda: [folder])
    env = ValidatorEnv(seen=MemorySeenStore(), data_dir=tmp_path, task_id="task-1")
    judge_ = PipelineJudge(PipelineSettings(), env)
    assert not judge_.calibrated and judge_.forward == TINY_FORWARD.per_position()
    assert judge_.forward.mean_limit(1) == judge_.forward.offset_limit(10**6) == float("inf")
    assert judge_._measured(["stage 0: off"])[0] == "soft_invalidate"
    folder.joinpath("tiny.json").write_text(CalibrationRecord.model_validate(
        {**shipped, "workloads": ["inference", "pipeline"],
         "pipeline": {"limits": {**TINY_FORWARD.figures(), "mean": 0.5}}}).model_dump_json())  # fmt: skip
    judge_ = PipelineJudge(PipelineSettings(), env)
    assert judge_.calibrated and judge_.forward.mean == 0.5
    assert judge_._measured(["stage 0: off"])[0] == "invalidate"


def test_file_limits_loosen_for_small_files_and_tighten_for_large_ones() -> None:
    """A file of one position may be as far off as the worst honest position (×2); the same mean over
    hundreds of positions is out. The offset adds up what points one way: noise cancels, a bias not."""
    assert TINY_FORWARD.mean_limit(1) > 0.0085 * 2 > TINY_FORWARD.mean_limit(300)
    gen = torch.Generator().manual_seed(0)
    replay = torch.randn(1, 300, 128, generator=gen)
    mask = torch.ones(1, 300, dtype=torch.long)
    noise = replay + torch.randn(replay.shape, generator=gen) * 0.002 * replay.std()
    shifted = replay + 0.01 * replay.pow(2).mean(-1, keepdim=True).sqrt()
    assert not forward_verdict(Differences.of(noise, replay, mask), TINY_FORWARD)[0]
    guilty, why, figures = forward_verdict(Differences.of(shifted, replay, mask), TINY_FORWARD)
    assert guilty and math.isclose(figures.offset, 0.01, rel_tol=0.05) and "offset" in why
    assert not forward_verdict(Differences.of(shifted[:, :1], replay[:, :1], mask[:, :1]), TINY_FORWARD)[0]
