"""`intellect-validator`: judge files (`check`), watch a pool and vote (`run`), and the commands the
installed workload plug-ins add (the inference workload's `calibrate`: measure a model's limits)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from intellect.cli import checkpoint_flags
from intellect.device import DeviceSettingError, resolve_device
from intellect.identity import Wallet, resolve_passphrase
from intellect.logs import configure_logging
from intellect.wire.tasks import TaskSpec, WorkloadRef
from intellect.wire.verdicts import Submission
from intellect.workloads import (
    DEFAULT_MAX_FILE_BYTES,
    FileJudge,
    MemorySeenStore,
    NoCheckpoints,
    ValidatorCommands,
    ValidatorEnv,
    WorkloadError,
    claimant,
    installed,
    load,
    settings_for,
)
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from validator.api import create_app
from validator.checkpoints import FileCheckpoints, TrainerCheckpoints
from validator.service import ValidatorService
from validator.settings import ValidatorSettings, chain_data_dir
from validator.store import SqlNodeWindows, SqlSeenStore
from validator.tasks import TaskBook, TaskJudge

app = typer.Typer(
    help="The validator: judge rollout files, watch a pool, vote to slash cheaters.", no_args_is_help=True
)
console = Console()
err = Console(stderr=True, soft_wrap=True)


@app.callback()
def main() -> None:
    """The validator: judge rollout files, watch a pool, vote to slash cheaters."""


@app.command()
def check(
    paths: list[Path] = typer.Argument(
        ..., help="files to judge, in submission order (rollout parquet, or the task's workload format)"
    ),
    node: str | None = typer.Option(
        None, "--node", help="submitter's address (default: the file's own claim)"
    ),
    work_units: int | None = typer.Option(None, "--work-units", min=0, help="units claimed on chain"),
    trainer_step: int | None = typer.Option(None, "--trainer-step", min=0, help="trainer step at submission"),
    work_key: str | None = typer.Option(None, "--work-key", help="0x + sha256 recorded on chain"),
    task: Path | None = typer.Option(
        None, "--task", help="the files' task spec JSON as POSTed (or a bare settings object of --workload), "
        "judged by the plug-in it names; default: --workload's defaults",
    ),
    workload: str = typer.Option(
        "inference", "--workload", help="the plug-in that judges the files when --task names none",
    ),
    checkpoint: list[str] = typer.Option(
        [], "--checkpoint", help="STEP=PATH of a trainer checkpoint (repeat)"
    ),
    max_bytes: int = typer.Option(DEFAULT_MAX_FILE_BYTES, "--max-bytes", min=1, help="largest file accepted"),
    device: str = typer.Option(
        "cpu", "--device", envvar="INTELLECT_VALIDATOR_DEVICE", help="where the recomputation runs: cpu "
        "(default: where the thresholds were calibrated), auto, cuda or cuda:N",
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per file, one per line"),
) -> None:
    """Judge local files with their task's workload plug-in, as `run` does; exit 1 unless all are accepted.

    Files are judged in the order given, so a later file repeating an earlier one is a duplicate."""
    submission = Submission(node=node, work_units=work_units, trainer_step=trainer_step, work_key=work_key)
    try:
        resolve_device(device)
        steps = checkpoint_flags(checkpoint)
        plugin, settings = settings_for(task_spec(task, workload))
    except DeviceSettingError as exc:
        err.print(f"error: --device: {exc}", markup=False)
        raise typer.Exit(2) from None
    except (ValueError, typer.BadParameter, WorkloadError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    folder = Path(tempfile.mkdtemp(prefix="intellect-check-"))
    env = ValidatorEnv(seen=MemorySeenStore(), data_dir=folder, checkpoints=FileCheckpoints(steps),
                       max_file_bytes=max_bytes, device=device)  # fmt: skip
    judge = plugin.file_judge(settings, env)
    verdicts = [judge.judge(p, submission) for p in paths]
    if as_json:
        for v in verdicts:
            print(json.dumps({"file": v.file, "verdict": v.verdict, "reasons": v.reasons, "rows": v.rows,
                              "seconds": v.seconds, "tokens": v.tokens, "step": v.step,
                              "timings": v.timings,
                              "judged_by": v.judged_by.model_dump() if v.judged_by else None}))  # fmt: skip
    else:
        table = Table(title="validation")
        for col in ("file", "verdict", "rows", "tokens", "seconds", "reasons"):
            table.add_column(col, overflow="fold")
        for v in verdicts:
            color = {"accept": "green", "invalidate": "red"}.get(v.verdict, "yellow")
            table.add_row(Path(v.file).name, f"[{color}]{v.verdict}[/{color}]", str(v.rows), str(v.tokens),
                          f"{v.seconds:.2f}", "\n".join(v.reasons))  # fmt: skip
        console.print(table)
        for label in sorted({v.judged_by.label() for v in verdicts if v.judged_by}):
            console.print(f"limits: {label}", markup=False)
    if any(v.verdict != "accept" for v in verdicts):
        raise typer.Exit(1)


def task_spec(task: Path | None, workload: str) -> TaskSpec:
    """The task `check` judges by: a spec file as POSTed (naming its workload, or a raw form a plug-in
    claims, else `workload`), a bare settings object of `workload`, or `workload`'s defaults."""
    if task is None:
        return TaskSpec(name="check", image="", workload=WorkloadRef(type=workload))
    try:
        body = json.loads(task.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--task {task}: not a readable JSON file ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError(f"--task {task}: a JSON object is expected (a task spec or its settings)")
    try:
        if not ({"env_vars", "workload", "name"} & set(body)):
            return TaskSpec(name="check", image="", workload=WorkloadRef(type=workload, settings=body))
        spec = TaskSpec.model_validate({"name": "check", "image": ""} | body)
    except ValidationError as exc:
        raise ValueError(f"--task {task}: {exc}") from None
    if spec.workload is None and claimant(spec) is None:
        spec = spec.model_copy(update={"workload": WorkloadRef(type=workload)})
    return spec


def add_plugin_commands(target: typer.Typer) -> None:
    """Commands the installed workload plug-ins add (`ValidatorCommands`), e.g. `calibrate`; a plug-in
    that fails to load adds none (its tasks are refused when judged, naming why)."""
    for name in sorted(installed()):
        try:
            plugin = load(name)
        except WorkloadError:
            continue
        if isinstance(plugin, ValidatorCommands):
            for command, function in plugin.validator_commands().items():
                target.command(command)(function)


add_plugin_commands(app)


def build_judge(settings: ValidatorSettings, wallet: Wallet) -> Callable[[SqlSeenStore], FileJudge]:
    """Each file judged by its own task: learned from the orchestrator, with that task's workload
    plug-in (validator/tasks.py). Nothing about the task comes from this validator's own settings."""

    def factory(seen: SqlSeenStore) -> FileJudge:
        checkpoints = (TrainerCheckpoints(settings.step_url, settings.data_dir / "checkpoints")
                       if settings.step_url else NoCheckpoints())  # fmt: skip
        env = ValidatorEnv(seen=seen, data_dir=settings.data_dir, checkpoints=checkpoints,
                           max_file_bytes=settings.max_file_bytes,
                           windows=SqlNodeWindows(seen.db), device=settings.device)  # fmt: skip
        return TaskJudge(TaskBook(settings.orchestrator_url, wallet), env)

    return factory


def load_wallet(settings: ValidatorSettings) -> Wallet:
    if settings.key is not None:
        return Wallet.from_key(settings.key.get_secret_value())
    if settings.keystore is not None:
        return Wallet.load(settings.keystore, resolve_passphrase("Validator keystore passphrase: "))
    raise ValueError("no validator key: set INTELLECT_VALIDATOR_KEY or --keystore (a keystore file)")


def with_chain_data_dir(settings: ValidatorSettings) -> ValidatorSettings:
    """Reach the chain and check the deployment (LedgerConfigError naming the URL or file otherwise);
    unless a data folder was given (flag or env), use the deployment's own subfolder of the default."""
    client = LedgerClient(settings.rpc_url, settings.deployment)
    if "data_dir" in settings.model_fields_set:
        return settings
    block = client.w3.eth.get_block(client.deployment.block)
    folder = chain_data_dir(settings.data_dir, client.deployment.chain_id, client.pools.address,
                            bytes(block["hash"]).hex())  # fmt: skip
    return settings.model_copy(update={"data_dir": folder})


@app.command()
def run(
    rpc_url: str | None = typer.Option(None, help="chain RPC (env INTELLECT_VALIDATOR_RPC_URL)"),
    deployment: Path | None = typer.Option(None, help="deployment.json of the contracts"),
    pool: list[int] = typer.Option([], "--pool", help="pool id to validate (repeat); default 1"),
    keystore: Path | None = typer.Option(None, help="keystore of the validator key"),
    orchestrator_url: str | None = typer.Option(None, help="orchestrator (file storage)"),
    step_url: str | None = typer.Option(None, help="trainer step counter URL"),
    data_dir: Path | None = typer.Option(
        None, help="database, files and checkpoints (default ~/.intellect/validator/<chain id>-<pool "
        "contract>-<deployment block>)",
    ),
    database_url: str | None = typer.Option(None, help="SQLAlchemy URL (default SQLite in data dir)"),
    host: str | None = typer.Option(None, help="API address"),
    port: int | None = typer.Option(None, help="API port"),
    vote: bool | None = typer.Option(None, "--vote/--no-vote", help="send invalidation votes"),
    device: str | None = typer.Option(
        None, help="where the recomputation runs: auto, cpu, cuda or cuda:N (env INTELLECT_VALIDATOR_DEVICE; "
        "default cpu, where the thresholds were calibrated)",
    ),
) -> None:
    """Watch the pools' submitted work, judge every file, vote to slash cheaters; serve the API."""
    overrides: dict[str, Any] = {  # field values of every type: the settings model validates them
        "rpc_url": rpc_url,
        "deployment": deployment,
        "pool_ids": pool or None,
        "keystore": keystore,
        "orchestrator_url": orchestrator_url,
        "step_url": step_url,
        "data_dir": data_dir,
        "database_url": database_url,
        "host": host,
        "port": port,
        "vote": vote,
        "device": device,
    }
    try:
        settings = ValidatorSettings(**{k: v for k, v in overrides.items() if v is not None})
        resolve_device(settings.device)  # CUDA asked where there is none: refused now, not per file
        wallet = load_wallet(settings)
        settings = with_chain_data_dir(settings)
        judge_factory = build_judge(settings, wallet)
        service = ValidatorService(settings, wallet, judge_factory)
    except (ValueError, OSError, LedgerError) as exc:  # one line naming what to fix, never a traceback
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    import uvicorn

    from intellect.http_server import bind_listener, server_options

    try:
        listener = bind_listener(settings.host, settings.port)
    except OSError as exc:
        err.print(f"error: cannot serve the validator API on {settings.host}:{settings.port}: "
                  f"{exc.strerror or exc} (another validator running? pick another --port)", markup=False)
        raise typer.Exit(1) from None
    configure_logging()
    service.start()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host=settings.host, port=settings.port,
                                           log_level="warning", **server_options()))
    try:
        server.run(sockets=[listener])
    finally:
        service.stop()
