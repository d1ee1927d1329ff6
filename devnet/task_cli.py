"""`intellect task …`: what a trainer posting tasks uses every day, over the SDK (`intellect.client`).

The orchestrator is found from `--url`/`INTELLECT_ORCHESTRATOR_URL` and the admin token from
`--token-file`/`INTELLECT_ADMIN_TOKEN`; with neither, from a running devnet (`--dir`, default
`.devnet`), so `intellect task list` just works next to `make devnet`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer
from rich.console import Console
from rich.table import Table

from devnet.state import DevnetState
from intellect.cli import err, fail
from intellect.client import OrchestratorClient, TaskApiError, load_spec
from intellect.wire.tasks import TaskState
from intellect.workloads import UNJUDGED

app = typer.Typer(
    help="Submit and follow tasks on an orchestrator (the trainer's side).", no_args_is_help=True
)
console = Console()
T = TypeVar("T")


class Target:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token


@app.callback()
def target(
    ctx: typer.Context,
    url: str | None = typer.Option(
        None, "--url", envvar="INTELLECT_ORCHESTRATOR_URL", help="orchestrator base URL"
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="INTELLECT_ADMIN_TOKEN",
        help="the orchestrator's admin token",
        show_default=False,
    ),
    token_file: Path | None = typer.Option(None, "--token-file", help="file holding the admin token"),
    directory: Path = typer.Option(
        Path(".devnet"), "--dir", envvar="INTELLECT_DEVNET_DIR", help="devnet to use when no --url is given"
    ),
) -> None:
    """Where the orchestrator is, and the token its task API takes."""
    if token is None and token_file is not None:
        if not token_file.is_file():
            raise fail(f"--token-file {token_file} does not exist")
        token = token_file.read_text().strip()
    if url is None or token is None:
        state = DevnetState.load(directory)
        orchestrator = state.process("orchestrator") if state else None
        if state is None or orchestrator is None or orchestrator.url is None:
            raise fail(
                "no orchestrator given: pass --url and --token-file (or set INTELLECT_ORCHESTRATOR_URL and "
                f"INTELLECT_ADMIN_TOKEN), or start a devnet in {directory} with `intellect devnet up`"
            )
        url = url or orchestrator.url
        if token is None:
            token = (Path(state.directory) / "orchestrator" / "admin-token").read_text().strip()
    ctx.obj = Target(url, token)


def _client(ctx: typer.Context) -> OrchestratorClient:
    t: Target = ctx.obj
    return OrchestratorClient(t.url, token=t.token)


def _ask(ctx: typer.Context, call: Callable[[OrchestratorClient], T]) -> T:
    """One exchange with the orchestrator; its refusal, a CLI failure."""
    try:
        with _client(ctx) as c:
            return call(c)
    except TaskApiError as exc:
        raise fail(str(exc)) from None


@app.command("submit")
def submit(
    ctx: typer.Context,
    spec_file: Path = typer.Argument(..., help="task spec, .json or .yaml", exists=True, dir_okay=False),
    as_json: bool = typer.Option(False, "--json", help="print the created task as JSON"),
    backend: str | None = typer.Option(
        None, "--backend", help="an inference task's generating engine, torch | vllm: sets its "
        "workload.settings.backend, the calibration its files are judged under",
    ),
) -> None:
    """Create a task from a spec file (validated here and by the orchestrator)."""
    try:
        spec = load_spec(spec_file)
        if backend is not None:
            if spec.workload is None or spec.workload.type != "inference":
                raise ValueError("--backend sets an inference task's workload.settings.backend, and this "
                                 "spec names no inference workload")  # fmt: skip
            spec.workload.settings["backend"] = backend
        with _client(ctx) as c:
            task = c.submit(spec)
    except (ValueError, TaskApiError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(task.model_dump_json(indent=2))
    else:
        workload = task.spec.workload.type if task.spec.workload else "no workload"
        console.print(f"task [bold]{task.id}[/bold] created: {task.spec.name} ({task.spec.image}, "
                      f"{workload})")
    for warning in task.warnings:  # on stderr, so --json output stays one document
        err.print(f"[yellow]warning:[/yellow] {warning}")


@app.command("list")
def list_tasks(
    ctx: typer.Context,
    include_deleted: bool = typer.Option(False, "--all", help="include deleted tasks"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Tasks with the nodes reporting each state."""
    tasks, nodes = _ask(ctx, lambda c: (c.list(include_deleted), c.nodes().nodes))
    states: dict[str, dict[str, int]] = {}
    for n in nodes:
        if n.task is not None:
            per = states.setdefault(n.task.task_id, {})
            per[n.task.state.value] = per.get(n.task.state.value, 0) + 1
    if as_json:
        print(
            json.dumps([t.model_dump(mode="json") | {"nodes": states.get(t.id, {})} for t in tasks], indent=2)
        )
        return
    table = Table(title=f"tasks ({len(tasks)})")
    for col in ("id", "name", "image", "created", "nodes", "deleted"):
        table.add_column(col)
    for t in tasks:
        summary = ", ".join(f"{k} {v}" for k, v in sorted(states.get(t.id, {}).items())) or "-"
        table.add_row(
            t.id,
            t.spec.name,
            t.spec.image,
            t.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            summary,
            "yes" if t.deleted else "",
        )
    console.print(table)


@app.command("status")
def status(ctx: typer.Context, task_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """One task and what every node running it reports."""
    progress = _ask(ctx, lambda c: c.status(task_id))
    if as_json:
        print(progress.model_dump_json(indent=2))
        return
    t = progress.task
    console.print(
        f"[bold]{t.id}[/bold] {t.spec.name} ({t.spec.image}){'  [red]deleted[/red]' if t.deleted else ''}"
    )
    if not t.judged:
        console.print(f"[yellow]{UNJUDGED}[/yellow] (it names no workload)")
    table = Table()
    for col in ("node", "state", "exit", "detail"):
        table.add_column(col)
    for n in progress.nodes:
        table.add_row(n.node, n.state.value, "" if n.exit_code is None else str(n.exit_code), n.detail or "")
    console.print(table if progress.nodes else "no node reports this task yet")


@app.command("wait")
def wait(
    ctx: typer.Context,
    task_id: str,
    state: TaskState = typer.Option(TaskState.RUNNING, "--state", help="the state to wait for"),
    nodes: int = typer.Option(1, "--nodes", min=1, help="how many nodes must report it"),
    timeout: float = typer.Option(300.0, "--timeout", min=0.0, help="seconds before giving up (exit 1)"),
) -> None:
    """Block until enough nodes report the state."""
    progress = _ask(ctx, lambda c: c.wait(task_id, state, nodes=nodes, timeout=timeout))
    console.print(f"task {task_id}: {progress.count(state)} node(s) {state.value}")


@app.command("logs")
def logs(
    ctx: typer.Context,
    task_id: str,
    tail: int = typer.Option(100, "--tail", min=0, max=10_000, help="lines per node"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines until Ctrl-C"),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="seconds between polls with -f"),
) -> None:
    """The task's log lines on each node running it (prefixed with the node)."""
    seen: dict[str, list[str]] = {}
    try:
        with _client(ctx) as c:
            while True:
                for node, lines in c.logs(task_id, tail).items():
                    old = seen.get(node, [])
                    new = _new_lines(old, lines)
                    for line in new:
                        sys.stdout.write(f"{node[:10]}… {line}\n")
                    seen[node] = lines
                sys.stdout.flush()
                if not follow:
                    return
                time.sleep(interval)
    except TaskApiError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        return


def _new_lines(old: list[str], current: list[str]) -> list[str]:
    """Lines of `current` after the longest suffix of `old` it starts with (a tail window slides)."""
    for start in range(len(old)):
        overlap = old[start:]
        if current[: len(overlap)] == overlap:
            return current[len(overlap) :]
    return current


@app.command("delete")
def delete(ctx: typer.Context, task_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Delete a task: workers stop it at their next heartbeat."""
    task = _ask(ctx, lambda c: c.delete(task_id))
    if as_json:
        print(task.model_dump_json(indent=2))
    else:
        console.print(f"task {task.id} deleted")
