"""The `arith` plug-in: what the orchestrator and the validators load (entry point `arith` in this
package's pyproject.toml). Cheap to import: the orchestrator loads it to check a task's settings.

Settings (`workload.settings`, each passed to the program as `INTELLECT_ARITH_<NAME>`):

| setting | default | what |
|---|---|---|
| `problems` | 64 | problems per file (1 work unit each) |
| `digits` | 40 | decimal digits of `a`, `b` and `m` (the work per problem grows with them) |
| `files` | 2 | files per node; the program then exits |

Verdicts (see `ArithJudge`): `accept` when every answer is right and the file is the node's own work
for this task, claimed for exactly its problem count and never paid before; `invalidate` (slash)
when the node's own file says otherwise; `soft_invalidate` (unpaid, nobody slashed) when the fault
may be the validator's or the storage's (bytes that are not what the chain names, a file over the
validator's own size limit, a file that is missing).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from intellect.wire.tasks import TaskSpec
from intellect.wire.verdicts import Submission, Verdict, VerdictKind
from intellect.workloads import (
    DEFAULT_MAX_FILE_BYTES,
    FileJudge,
    ValidatorEnv,
    WorkloadSettingsError,
    judged_again,
    with_program,
)
from intellect_arith.problems import MAX_DIGITS, ArithFileError, problem, problem_key, read_file

ENV_PREFIX = "INTELLECT_ARITH_"
IMAGE = "intellect-workload:latest"  # an image with this package installed (docker runtime)
ENTRYPOINT = ["python3", "-m", "intellect_arith"]
SHOWN_WRONG = 3  # wrong answers named in a verdict's reasons


class ArithSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    problems: int = Field(64, ge=1, le=4096)
    digits: int = Field(40, ge=1, le=MAX_DIGITS)
    files: int = Field(2, ge=1, le=100_000)


class ArithJudge:
    """Derives each file's problems, recomputes every answer, decides. Holds no model: nothing heavy."""

    def __init__(self, settings: ArithSettings, env: ValidatorEnv) -> None:
        self.settings = settings
        self.env = env

    def judge(self, path: Path, submission: Submission) -> Verdict:
        started = time.perf_counter()
        path = Path(path)

        def verdict(kind: VerdictKind, reasons: list[str], rows: int = 0) -> Verdict:
            return Verdict(file=str(path), verdict=kind, reasons=reasons, rows=rows, tokens=rows,
                           seconds=round(time.perf_counter() - started, 6))  # fmt: skip

        if not path.is_file():
            return verdict("soft_invalidate", [f"arith: {path} does not exist"])
        if path.stat().st_size > self.env.max_file_bytes:  # the validator's own limit: not evidence
            limit = self.env.max_file_bytes
            return verdict("soft_invalidate", [f"arith: over this validator's {limit}-byte limit"])
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        if submission.work_key and submission.work_key.lower().removeprefix("0x") != sha:
            return verdict("soft_invalidate", ["arith: the bytes fetched are not the file the chain names"])
        try:
            data = read_file(path, self.env.max_file_bytes)
        except ArithFileError as exc:  # the node wrote it and named it on chain: its own fault
            return verdict("invalidate", [f"arith: {exc}"])
        s, reasons = self.settings, []
        if self.env.task_id and data.task_id != self.env.task_id:
            reasons.append(f"arith: problems of task {data.task_id!r}, not of this task")
        if submission.node and data.node != submission.node.lower():
            reasons.append(f"arith: problems of node {data.node}, submitted by {submission.node}")
        if data.digits != s.digits or len(data.answers) != s.problems:
            reasons.append(f"arith: {len(data.answers)} problems of {data.digits} digits; the task asks for "
                           f"{s.problems} of {s.digits}")  # fmt: skip
        if submission.work_units is not None and submission.work_units != len(data.answers):
            claimed = submission.work_units
            reasons.append(f"arith: {claimed} units claimed on chain for {len(data.answers)} problems")
        keys = [problem_key(data.task_id, data.node, data.counter, k) for k in range(len(data.answers))]
        seen, pool = self.env.seen, submission.pool_id
        again = judged_again(seen, pool, sha)  # this submission judged again after a validator crash
        if not again and (seen.file_seen(pool, sha) or seen.rows_seen(pool, keys)):
            reasons.append(f"arith: counter {data.counter}'s problems were already paid")
        wrong = [k for k, given in enumerate(data.answers)
                 if int(given) != problem(data.task_id, data.node, data.counter, k, data.digits).answer()]
        if wrong:
            shown = ", ".join(str(k) for k in wrong[:SHOWN_WRONG])
            reasons.append(f"arith: {len(wrong)} of {len(data.answers)} answers wrong (problem {shown}"
                           f"{', ...' if len(wrong) > SHOWN_WRONG else ''})")  # fmt: skip
        if reasons:
            return verdict("invalidate", reasons, rows=len(data.answers))
        self.env.seen.remember(submission.pool_id, sha, keys)
        return verdict("accept", [], rows=len(data.answers))


class ArithWorkload:
    """`workload: {"type": "arith", "settings": {...}}`."""

    name: ClassVar[str] = "arith"

    def task_settings(self, spec: TaskSpec) -> ArithSettings:
        """From `workload.settings`, and from the `INTELLECT_ARITH_*` env vars `render` wrote (validators
        read the stored, rendered task): both places must agree. Any other `INTELLECT_ARITH_*` name is
        refused: no task can tell its nodes to cheat."""
        values = dict(spec.workload.settings) if spec.workload else {}
        for key, raw in spec.env_vars.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key.removeprefix(ENV_PREFIX).lower()
            if name not in ArithSettings.model_fields:
                raise WorkloadSettingsError(f"env_vars.{key}", "not an arith setting")
            if name in values and str(values[name]) != raw:
                raise WorkloadSettingsError(f"env_vars.{key}", f"{raw!r} disagrees with workload.settings")
            values.setdefault(name, raw)
        try:
            return ArithSettings.model_validate(values)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "settings"
            raise WorkloadSettingsError(f"workload.settings.{where}", str(error["msg"])) from None

    def render(self, spec: TaskSpec, settings: BaseModel) -> TaskSpec:
        env = dict(spec.env_vars)
        for name, value in settings.model_dump().items():
            env[ENV_PREFIX + name.upper()] = str(value)
        return with_program(spec, env, IMAGE, ENTRYPOINT)

    def work_units(self, path: Path) -> int:
        return len(read_file(path, DEFAULT_MAX_FILE_BYTES).answers)

    def file_judge(self, settings: BaseModel, env: ValidatorEnv) -> FileJudge:
        task = settings if isinstance(settings, ArithSettings) else ArithSettings.model_validate(settings)
        return ArithJudge(task, env)
