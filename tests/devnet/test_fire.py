"""`intellect devnet fire`: the whole protocol under fire. The plan's parts without a network (the seeded
faults, the roster, how each cheater runs), then the short form through the command a user runs, on
namespaced hosts: every cheater kind caught by its rule, no honest node harmed, every payout traced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devnet.fire import CHEAT_KINDS, LINK_DELAY, MEMBER_OF_3, FirePlan, worker_spec

INTELLECT = [str(Path(sys.executable).parent / "intellect")]
EVERY_KIND = {"perturbed-model", "inflated-units", "frame", "withhold", "copy", "hardware"}


def test_the_faults_are_drawn_from_the_seed_and_spaced() -> None:
    full, short = FirePlan(seed=3).faults(), FirePlan(seed=3, short=True).faults()
    assert [f.describe() for f in full] == [f.describe() for f in FirePlan(seed=3).faults()]  # replayable
    assert [f.describe() for f in full] != [f.describe() for f in FirePlan(seed=4).faults()]
    assert {f.kind for f in short} == {"links-cut", "kill-validator", "kill-orchestrator", "kill-relay"}
    assert {f.kind for f in full} == {f.kind for f in short} | {"host-cut"}
    for faults in (full, short):
        times = [f.at for f in faults]
        assert times == sorted(times) and all(b - a >= 20 for a, b in zip(times, times[1:], strict=False))
    cut = next(f for f in full if f.kind == "links-cut")
    assert cut.hold == 30 and cut.target == MEMBER_OF_3  # drawn when it comes: the groups re-form


def test_both_forms_keep_a_cheater_of_every_kind_each_on_its_own_node() -> None:
    assert set(CHEAT_KINDS) == EVERY_KIND
    for plan in (FirePlan(), FirePlan(short=True)):
        roster = plan.roster()
        assert {r.cheat for r in roster if r.cheat} == EVERY_KIND
        assert len({r.index for r in roster}) == len(roster)
        assert sum(r.place == "group" for r in roster) == 5 and any(r.nat for r in roster)
        assert any(r.cheat == "frame" and r.place == "group" for r in roster)
    assert FirePlan(short=True).trainer_steps < FirePlan().trainer_steps


def test_each_cheater_runs_as_its_operator_would() -> None:
    roles = {r.cheat or f"honest-{r.index}": r for r in FirePlan().roster()}
    task_env = lambda spec: json.loads(spec.env.get("INTELLECT_WORKER_TASK_ENV", "{}"))  # noqa: E731
    assert task_env(worker_spec(roles["perturbed-model"]))["INTELLECT_INFER_CHEAT"] == "perturbed-model"
    assert task_env(worker_spec(roles["frame"]))["INTELLECT_PIPELINE_CHEAT"] == "frame"
    for kind in ("withhold", "copy", "hardware"):  # a patched client, not a task setting
        spec = worker_spec(roles[kind])
        assert spec.program == kind and task_env(spec) == {}
    honest = worker_spec(roles["honest-1"])
    assert honest.program is None and honest.env == {} and honest.p2p and honest.link_delay == LINK_DELAY


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_short_form_catches_every_cheater_and_harms_no_honest_node(tmp_path: Path) -> None:
    directory = tmp_path / "fire"
    argv = [*INTELLECT, "devnet", "fire", "--short", "--seed", "5", "--dir", str(directory), "--json",
            "--timeout", "1200"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1450)
        assert done.stdout.strip(), done.stderr[-4000:]
        report = json.loads(done.stdout)
        # the promise first, with what went wrong if it did not hold
        assert report["problems"] == [], report["problems"]
        assert all(report["checks"].values()), {k: v for k, v in report["checks"].items() if not v}
        assert done.returncode == 0, done.stderr[-3000:]
        nodes = report["nodes"]
        caught = {n["cheat"]: n for n in nodes if n["cheat"]}
        assert set(caught) == EVERY_KIND
        for kind, node in caught.items():
            assert node["caught_by"], (kind, node)  # the rule that caught it, named
            if kind == "hardware":
                assert not node["in_pool"] and node["stake_after"] == node["stake_before"]
            else:
                assert node["slashed"] and not node["in_pool"], (kind, node)
        for node in (n for n in nodes if not n["cheat"]):
            assert not node["slashed"] and node["invalid_votes"] == 0 and not node["blacklisted"], node
            assert node["locked"] + node["claimed"] + node["claimable"] > 0, node
            assert node["audit"]["reconciled"] or node["audit"]["payouts"] == 0, node
            assert node["audit"]["paid_without_accept"] == [], node
        assert sum(n["audit"]["paid_files"] for n in nodes) > 0  # the audit traced real payouts
        assert [f["kind"] for f in report["faults"]] and all(f["ended"] for f in report["faults"])
        assert report["steps"] >= 4 and len(report["curve"]) == report["steps"]
        assert (directory / "fire" / "report.json").is_file()
        assert len(report["groups"]) == 2 and sorted(len(g["nodes"]) for g in report["groups"]) == [2, 3]
    finally:
        down = subprocess.run([*INTELLECT, "devnet", "down", "--dir", str(directory), "--purge"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert down.returncode == 0, down.stderr
