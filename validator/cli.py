"""`intellect-validator`: judge rollout files (`check`), watch a pool and vote (`run`), measure a
model's limits (`calibrate`)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from intellect.identity import Wallet, resolve_passphrase
from intellect.logs import configure_logging
from intellect.wire.tasks import TaskSpec
from intellect.workloads import FileJudge, ValidatorEnv, WorkloadError, settings_for
from ledger.client import LedgerClient
from ledger.errors import LedgerError
from validator.api import create_app
from validator.calibrate_cli import calibrate_command, checkpoint_flags
from validator.memory import LocalCheckpoints, MemorySeenStore
from validator.pipeline import DEFAULT_MAX_BYTES, Pipeline
from validator.service import ValidatorService
from validator.settings import ValidatorSettings, chain_data_dir
from validator.store import SqlNodeWindows, SqlSeenStore
from validator.task import TaskSettings
from validator.tasks import TaskBook, TaskJudge
from validator.thresholds import ValidationThresholds
from validator.verdicts import Judge, Submission
from workloads.device import DeviceSettingError, resolve_device

app = typer.Typer(
    help="The validator: judge rollout files, watch a pool, vote to slash cheaters.", no_args_is_help=True
)
console = Console()
err = Console(stderr=True, soft_wrap=True)


@app.callback()
def main() -> None:
    """The validator: judge rollout files, watch a pool, vote to slash cheaters."""


app.command("calibrate")(calibrate_command)


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
        None, "--task", help="the files' task spec JSON as POSTed (workload settings or INTELLECT_INFER_* "
        "env vars), judged by the plug-in it names; default: the inference workload's defaults",
    ),
    checkpoint: list[str] = typer.Option(
        [], "--checkpoint", help="STEP=PATH of a trainer checkpoint (repeat)"
    ),
    max_bytes: int = typer.Option(DEFAULT_MAX_BYTES, "--max-bytes", min=1, help="largest file accepted"),
    device: str = typer.Option(
        "cpu", "--device", envvar="INTELLECT_VALIDATOR_DEVICE", help="where the recomputation runs: cpu "
        "(default: where the thresholds were calibrated), auto, cuda or cuda:N",
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per file, one per line"),
) -> None:
    """Run the full validation pipeline on local files. Exit 0 when all are accepted, 1 otherwise.

    Files are judged in the order given, so a later file repeating an earlier one is a duplicate."""
    submission = Submission(node=node, work_units=work_units, trainer_step=trainer_step, work_key=work_key)
    try:
        resolve_device(device)
    except DeviceSettingError as exc:
        err.print(f"error: --device: {exc}", markup=False)
        raise typer.Exit(2) from None
    other = _other_workload_judge(task, max_bytes, device) if task else None
    if other is not None:  # a task of another workload plug-in: judged by that plug-in's checks
        if checkpoint:
            err.print("error: --checkpoint is for inference tasks; this task names another workload")
            raise typer.Exit(2)
        verdicts = [other.judge(p, submission) for p in paths]
    else:
        try:
            settings = TaskSettings.from_spec_file(task) if task else TaskSettings.defaults()
            steps = checkpoint_flags(checkpoint)
        except (ValueError, typer.BadParameter) as exc:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(2) from None
        pipeline = Pipeline(settings, MemorySeenStore(), LocalCheckpoints(settings.model, steps),
                            ValidationThresholds(), max_bytes=max_bytes, device=device)  # fmt: skip
        verdicts = [pipeline.judge(p, submission) for p in paths]
    if as_json:
        for v in verdicts:
            print(
                json.dumps(
                    {
                        "file": v.file,
                        "verdict": v.verdict,
                        "reasons": v.reasons,
                        "rows": v.rows,
                        "seconds": v.seconds,
                        "tokens": v.tokens,
                        "step": v.step,
                        "timings": v.timings,
                    }
                )
            )
    else:
        table = Table(title="validation")
        for col in ("file", "verdict", "rows", "tokens", "seconds", "reasons"):
            table.add_column(col, overflow="fold")
        for v in verdicts:
            color = {"accept": "green", "invalidate": "red"}.get(v.verdict, "yellow")
            table.add_row(
                Path(v.file).name,
                f"[{color}]{v.verdict}[/{color}]",
                str(v.rows),
                str(v.tokens),
                f"{v.seconds:.2f}",
                "\n".join(v.reasons),
            )
        console.print(table)
    if any(v.verdict != "accept" for v in verdicts):
        raise typer.Exit(1)


def _other_workload_judge(task: Path, max_bytes: int, device: str = "auto") -> FileJudge | None:
    """The judge of the plug-in a task file names, when that is not the inference workload (whose
    checks take this command's checkpoint flags); None for inference tasks and bare settings."""
    try:
        body = json.loads(task.read_text())
    except (OSError, ValueError):
        return None  # TaskSettings.from_spec_file names the problem
    kind = body.get("workload", {}).get("type") if isinstance(body, dict) else None
    if not isinstance(kind, str) or kind == "inference":
        return None
    try:
        plugin, settings = settings_for(TaskSpec.model_validate(body))
    except (ValueError, WorkloadError) as exc:
        err.print(f"error: --task {task}: {exc}", markup=False)
        raise typer.Exit(2) from None
    folder = Path(tempfile.mkdtemp(prefix="intellect-check-"))
    env = ValidatorEnv(seen=MemorySeenStore(), data_dir=folder, max_file_bytes=max_bytes, task_id="",
                       device=device)  # fmt: skip
    return plugin.file_judge(settings, env)


def build_judge(settings: ValidatorSettings, wallet: Wallet) -> Callable[[SqlSeenStore], Judge]:
    """Each file judged by its own task: learned from the orchestrator, with that task's workload
    plug-in (validator/tasks.py). Nothing about the task comes from this validator's own settings."""

    def factory(seen: SqlSeenStore) -> Judge:
        env = ValidatorEnv(seen=seen, data_dir=settings.data_dir, step_url=settings.step_url,
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
