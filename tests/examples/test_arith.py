"""The third workload (examples/arith), through the seam only: its settings at POST time, what it
renders for the workers, its program as a process, and its judge on honest, cheating and hostile
files. (On a devnet, slashed on chain next to the worker cheaters: tests/devnet/test_cheaters.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from intellect_arith.problems import problem, write_file

from intellect import workloads
from intellect.wire.tasks import TaskSpec
from intellect.wire.verdicts import Submission
from intellect.workloads import MemorySeenStore, ValidatorEnv, WorkloadSettingsError

NODE = "0x" + "ab" * 20
OTHER = "0x" + "cd" * 20
TASK = "task-arith"


def spec(settings: dict, env: dict | None = None) -> TaskSpec:
    return TaskSpec.model_validate({"name": "arith", "workload": {"type": "arith", "settings": settings},
                                    "env_vars": env or {}})  # fmt: skip


def judge_of(tmp: Path, settings: dict | None = None, **env_fields):  # noqa: ANN201
    plugin, task = workloads.settings_for(spec(settings or {"problems": 8, "digits": 20}))
    env = ValidatorEnv(seen=MemorySeenStore(), data_dir=tmp, task_id=TASK, **env_fields)
    return plugin.file_judge(task, env)


def made(tmp: Path, counter: int = 1, node: str = NODE, task: str = TASK, count: int = 8, digits: int = 20,
         wrong: bool = False) -> Path:  # fmt: skip
    return write_file(tmp / f"f-{node[:6]}-{task}-{counter}-{wrong}.json", task, node, counter, count, digits,
                      wrong=wrong)  # fmt: skip


def test_the_plugin_is_installed_by_its_own_entry_point() -> None:
    assert "arith" in workloads.installed()
    assert workloads.installed()["arith"].value == "intellect_arith.plugin:ArithWorkload"


def test_settings_are_checked_and_rendered_as_env_vars() -> None:
    plugin, task = workloads.settings_for(spec({"problems": 5}))
    rendered = plugin.render(spec({"problems": 5}), task)
    assert rendered.env_vars["INTELLECT_ARITH_PROBLEMS"] == "5"
    assert rendered.env_vars["INTELLECT_ARITH_DIGITS"] == "40"
    assert rendered.entrypoint == ["python3", "-m", "intellect_arith"] and rendered.image
    with pytest.raises(WorkloadSettingsError) as bad:
        workloads.settings_for(spec({"problems": 0}))
    assert bad.value.field == "workload.settings.problems"
    with pytest.raises(WorkloadSettingsError) as unknown:
        workloads.settings_for(spec({"answers": 3}))
    assert unknown.value.field == "workload.settings.answers"
    with pytest.raises(WorkloadSettingsError) as told:  # no task can tell its nodes to cheat
        workloads.settings_for(spec({}, {"INTELLECT_ARITH_CHEAT": "wrong-answer"}))
    assert told.value.field == "env_vars.INTELLECT_ARITH_CHEAT"
    stored = TaskSpec.model_validate(rendered.model_dump())  # what validators read back: the rendered task
    assert plugin.task_settings(stored) == task
    with pytest.raises(WorkloadSettingsError) as disagree:
        workloads.settings_for(spec({"problems": 5}, {"INTELLECT_ARITH_PROBLEMS": "6"}))
    assert disagree.value.field == "env_vars.INTELLECT_ARITH_PROBLEMS"


def test_problems_are_the_nodes_own_and_answers_exact() -> None:
    mine, theirs = problem(TASK, NODE, 1, 0, 30), problem(TASK, OTHER, 1, 0, 30)
    assert mine != theirs and mine != problem(TASK, NODE, 2, 0, 30) and mine != problem("t2", NODE, 1, 0, 30)
    assert all(len(str(x)) == 30 for x in (mine.a, mine.b, mine.m))
    assert mine.answer() == pow(mine.a, mine.b, mine.m) and problem(TASK, NODE, 1, 0, 30) == mine


def test_the_program_writes_its_files_outside_a_worker(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTELLECT_", "PYTEST"))}
    env |= {"INTELLECT_ARITH_PROBLEMS": "4", "INTELLECT_ARITH_DIGITS": "12", "INTELLECT_ARITH_FILES": "2",
            "INTELLECT_TASK_ID": TASK, "INTELLECT_NODE_ADDRESS": NODE, "INTELLECT_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "intellect_arith"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = sorted(tmp_path.glob("arith-*.json"))
    assert len(files) == 2 and [json.loads(line)["problems"] for line in done.stdout.splitlines()] == [4, 4]
    judge = judge_of(tmp_path, {"problems": 4, "digits": 12})
    assert [judge.judge(f, Submission(node=NODE, work_units=4)).verdict for f in files] == ["accept"] * 2
    assert workloads.load("arith").work_units(files[0]) == 4


def test_honest_files_are_paid_once_and_every_cheat_is_named(tmp_path: Path) -> None:
    judge = judge_of(tmp_path)
    honest = made(tmp_path)
    first = judge.judge(honest, Submission(node=NODE, work_units=8, pool_id=1))
    assert first.verdict == "accept" and first.rows == 8 and not first.reasons
    # the same submission judged again (a validator crash before its verdict was recorded): its own
    # problems are not a repeat of themselves (the chain refuses a work key twice in a pool)
    assert judge.judge(honest, Submission(node=NODE, work_units=8, pool_id=1)).verdict == "accept"
    respaced = tmp_path / "respaced.json"  # the same counter's problems in other bytes: a repeat
    respaced.write_text(json.dumps(json.loads(honest.read_text()), indent=1))
    cases = {
        "answers wrong": (made(tmp_path, counter=2, wrong=True), Submission(node=NODE, work_units=8)),
        "already paid": (respaced, Submission(node=NODE, work_units=8, pool_id=1)),
        "of node": (made(tmp_path, counter=3, node=OTHER), Submission(node=NODE, work_units=8)),
        "not of this task": (made(tmp_path, counter=4, task="another"), Submission(node=NODE, work_units=8)),
        "units claimed": (made(tmp_path, counter=5), Submission(node=NODE, work_units=80)),
        "the task asks for": (made(tmp_path, counter=6, count=4), Submission(node=NODE, work_units=4)),
    }
    for reason, (path, submission) in cases.items():
        v = judge.judge(path, submission)
        assert v.verdict == "invalidate" and any(reason in r for r in v.reasons), (reason, v)


def test_hostile_and_foreign_files(tmp_path: Path) -> None:
    judge = judge_of(tmp_path, max_file_bytes=4096)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 2000 + "]" * 2000)  # past the parser's recursion limit, under the size cap
    big = tmp_path / "big.json"
    big.write_text(" " * 5000)
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(made(tmp_path).read_bytes()[:-20])
    numbers = tmp_path / "numbers.json"
    body = json.loads(made(tmp_path, counter=9).read_text())
    numbers.write_text(json.dumps(body | {"answers": [int(x) for x in body["answers"]]}))
    for path in (deep, truncated, numbers):
        assert judge.judge(path, Submission(node=NODE)).verdict == "invalidate", path
    # the validator's own limit, the storage's bytes, a missing file: never evidence against the node
    assert judge.judge(big, Submission(node=NODE)).verdict == "soft_invalidate"
    assert judge.judge(made(tmp_path, counter=10), Submission(node=NODE, work_key="0x" + "0" * 64)).verdict \
        == "soft_invalidate"
    assert judge.judge(tmp_path / "gone.json", Submission(node=NODE)).verdict == "soft_invalidate"
