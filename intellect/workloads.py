"""The workload seam: what the protocol needs from a workload, and where plug-ins are found.

A workload is whatever a task runs on the pool's workers and a validator judges: today the
single-node inference workload (`workloads/inference/plugin.py`); any Python package can add one
by declaring an entry point in the group `intellect.workloads` (docs/workloads.md):

    [project.entry-points."intellect.workloads"]
    my-workload = "my_package.plugin:MyWorkload"

The object the entry point names (an instance, or a class taking no arguments) must satisfy
`Workload` (and may satisfy `ClaimsRawTasks`: a task naming no workload that runs its program is
its task). The orchestrator calls `task_settings` and `render` when a task naming the workload is
POSTed (a refusal is a 422 naming the setting); a validator calls `task_settings` and `file_judge`
for the task each submitted file belongs to, and `FileJudge.judge` on each file. Nothing else in the
protocol knows any workload by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from intellect.wire.tasks import TaskSpec
from intellect.wire.verdicts import Submission, Verdict

ENTRY_POINT_GROUP = "intellect.workloads"
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024  # the largest submitted file a validator downloads and judges


class WorkloadError(Exception):
    """Base of the seam's errors; `str()` is the sentence a user reads."""


class UnknownWorkload(WorkloadError):
    """No plug-in of that name is installed here."""


class WorkloadSettingsError(WorkloadError):
    """A task's settings for its workload are refused; `field` names the setting (for a 422)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class SeenStore(Protocol):
    """Remembers, per pool, every judged file's sha256 and the hashes of its items (rows), so a file
    or an item is never paid twice. In `intellect-validator check`: memory; in `run`: SQL."""

    def file_seen(self, pool_id: int | None, sha256: str) -> bool: ...

    def rows_seen(self, pool_id: int | None, row_hashes: list[str]) -> set[str]: ...

    def remember(self, pool_id: int | None, sha256: str, row_hashes: list[str]) -> None: ...


def judged_again(seen: SeenStore, pool_id: int | None, sha256: str) -> bool:
    """Whether a pool's file is one this validator remembered before: the same submission judged again
    (a crash between remembering it and recording its verdict), never a second submission, because the
    chain refuses a work key (the file's sha256) already submitted in the pool. Its own rows are then
    not duplicates of themselves. Outside a pool (`check` on local files) a repeated file is a
    duplicate."""
    return pool_id is not None and seen.file_seen(pool_id, sha256)


class NodeWindows(Protocol):
    """A rolling window of per-file statistics for each (pool, node): a plug-in pools what one small
    file cannot show (a cheater must not be able to stay under a per-file minimum). Entries are JSON
    objects; `push` appends one, keeps the newest `keep`, and returns the window (oldest first)."""

    def push(
        self, pool_id: int | None, node: str, entry: dict[str, Any], keep: int
    ) -> list[dict[str, Any]]: ...


class CheckpointSource(Protocol):
    """The trainer's checkpoints by step, as the host knows them: the local safetensors file and its
    sha256 for a step, or None when the host knows no file for it. A workload resolves step 0 (its
    base model) itself when the host has none: only the workload knows which model a task names."""

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None: ...


class MemorySeenStore:
    """`SeenStore` for one process's life: one run of `intellect-validator check`, a bench, a test."""

    def __init__(self) -> None:
        self.files: dict[int | None, set[str]] = {}
        self.rows: dict[int | None, set[str]] = {}

    def file_seen(self, pool_id: int | None, sha256: str) -> bool:
        return sha256 in self.files.get(pool_id, set())

    def rows_seen(self, pool_id: int | None, row_hashes: list[str]) -> set[str]:
        return set(row_hashes) & self.rows.get(pool_id, set())

    def remember(self, pool_id: int | None, sha256: str, row_hashes: list[str]) -> None:
        self.files.setdefault(pool_id, set()).add(sha256)
        self.rows.setdefault(pool_id, set()).update(row_hashes)


class MemoryNodeWindows:
    """`NodeWindows` for one process's life (the service keeps them in SQL)."""

    def __init__(self) -> None:
        self.windows: dict[tuple[int | None, str], list[dict[str, Any]]] = {}

    def push(self, pool_id: int | None, node: str, entry: dict[str, Any], keep: int) -> list[dict[str, Any]]:
        window = self.windows.setdefault((pool_id, node.lower()), [])
        window.append(entry)
        del window[:-keep]
        return list(window)


class NoCheckpoints:
    """A host that knows no trainer checkpoint (a pool without a trainer, or a check of base-model files)."""

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        return None


@dataclass(frozen=True)
class ValidatorEnv:
    """What a validator (the judges' host) offers a plug-in's checks: its memory of judged files and of
    each node's recent statistics, the trainer's checkpoints by step, a private folder for caches, its
    file size limit, and where its models run (a device setting: auto, cpu, cuda or cuda:N). A judge's
    own limits are its settings (e.g. the inference judge's `INTELLECT_VALIDATOR_*` thresholds), read
    by the judge where it runs, never passed by the host."""

    seen: SeenStore
    data_dir: Path
    checkpoints: CheckpointSource = field(default_factory=NoCheckpoints)
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    windows: NodeWindows = field(default_factory=MemoryNodeWindows)
    task_id: str = ""  # the task whose files this judge gets ("" when judging files outside a task)
    device: str = "auto"  # auto: the first GPU PyTorch sees, else the CPU (`intellect.device`)


class FileJudge(Protocol):
    """Judges one downloaded file of one task. May hold heavy state (models); built once per task."""

    def judge(self, path: Path, submission: Submission) -> Verdict: ...


@runtime_checkable
class Workload(Protocol):
    """One kind of work a pool can run and pay for."""

    name: str

    def task_settings(self, spec: TaskSpec) -> BaseModel:
        """The task's settings for this workload, validated (`spec.workload.settings` and whatever else
        of the spec the plug-in reads, e.g. its env vars). Raises `WorkloadSettingsError`."""
        ...

    def render(self, spec: TaskSpec, settings: BaseModel) -> TaskSpec:
        """The spec the workers run: the plug-in's image and entry point where the task gave none, and
        the settings passed in the way the workload's program reads them (env vars, arguments)."""
        ...

    def work_units(self, path: Path) -> int:
        """How many work units one of its output files is worth (what a node may claim on chain)."""
        ...

    def file_judge(self, settings: BaseModel, env: ValidatorEnv) -> FileJudge:
        """The checks a validator runs on this task's files."""
        ...


@runtime_checkable
class ClaimsRawTasks(Protocol):
    """A plug-in that recognises its own program in a task that names no workload (the raw form tasks
    had before the seam: the plug-in's entry point, its settings as env vars). Optional: a plug-in
    without it claims nothing."""

    def claims(self, spec: TaskSpec) -> bool:
        """Whether `spec` (naming no workload) runs this plug-in's program."""
        ...


@runtime_checkable
class ValidatorCommands(Protocol):
    """A plug-in that adds commands to `intellect-validator` (e.g. the inference workload's `calibrate`,
    which measures a model's honest noise for its judge). Optional. Each value is a typer command
    function; the key is its name on the command line."""

    def validator_commands(self) -> dict[str, Callable[..., None]]: ...


def runs_module(spec: TaskSpec, module: str) -> bool:
    """Whether the task's program is `python -m <module>` (its entry point, else its command)."""
    argv = [*(spec.entrypoint or []), *spec.cmd] if spec.entrypoint is not None else list(spec.cmd)
    return any(a == "-m" and b == module for a, b in zip(argv, argv[1:], strict=False))


def with_program(spec: TaskSpec, env: dict[str, str], image: str, entrypoint: list[str]) -> TaskSpec:
    """`spec` with `env` as its env vars and, where the task gave none, the plug-in's image and entry
    point (a task may bring its own, e.g. the worker's Python under the process runtime)."""
    update: dict[str, Any] = {"env_vars": env}
    if not spec.image:
        update["image"] = image
    if spec.entrypoint is None and not spec.cmd:
        update["entrypoint"] = list(entrypoint)
    return TaskSpec.model_validate(spec.model_dump() | update)


def installed() -> dict[str, EntryPoint]:
    """Every plug-in registered in this environment, by name (a name registered twice: the last wins)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


_loaded: dict[tuple[str, str], Workload] = {}


def load(name: str) -> Workload:
    """The plug-in called `name`, loaded once per process. Raises `UnknownWorkload`."""
    found = installed()
    ep = found.get(name)
    if ep is None:
        have = ", ".join(sorted(found)) or "none"
        raise UnknownWorkload(f"no workload plug-in {name!r} is installed here (installed: {have})")
    key = (name, ep.value)
    if key not in _loaded:
        try:
            target: Any = ep.load()
        except Exception as exc:  # a broken third-party package must not take the service down
            raise UnknownWorkload(f"workload plug-in {name!r} ({ep.value}) failed to load: {exc}") from None
        plugin = target() if isinstance(target, type) else target
        if not isinstance(plugin, Workload):
            raise UnknownWorkload(f"{ep.value} does not implement intellect.workloads.Workload")
        _loaded[key] = plugin
    return _loaded[key]


def claimant(spec: TaskSpec) -> str | None:
    """The installed plug-in that claims a task naming no workload as its own raw form, if one does
    (plug-ins in name order; one that fails to load claims nothing)."""
    if spec.workload is not None:
        return spec.workload.type
    for name in sorted(installed()):
        try:
            plugin = load(name)
        except UnknownWorkload:
            continue
        if isinstance(plugin, ClaimsRawTasks) and plugin.claims(spec):
            return name
    return None


UNJUDGED = "unjudged: its files are not judged or paid"


def unjudged_warning(names: list[str] | None = None) -> str:
    """What a user reads about a task no plug-in judges, naming the installed ones and how to name one."""
    have = sorted(installed() if names is None else names)
    example = have[0] if have else "inference"
    return (f"{UNJUDGED}: the task names no workload and no installed plug-in claims its program "
            f"(installed workloads: {', '.join(have) or 'none'}; name one as workload.type, e.g. "
            f'"workload": {{"type": "{example}"}})')


def settings_for(spec: TaskSpec) -> tuple[Workload, BaseModel]:
    """The plug-in a task names (or, naming none, the one that claims its raw form) and the task's
    settings for it. Raises `WorkloadError`."""
    name = claimant(spec)
    if name is None:
        raise UnknownWorkload("the task names no workload (spec.workload.type) and no installed plug-in "
                              "claims its program: its files are unjudged")
    plugin = load(name)
    return plugin, plugin.task_settings(spec)
