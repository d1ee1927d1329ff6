"""`intellect-infer --help` (or `python -m workloads.inference`): run the inference workload."""

from __future__ import annotations

import sys

from pydantic import ValidationError
from pydantic_settings import CliApp
from rich.console import Console
from rich.table import Table

from intellect.logs import setup_logging
from workloads.inference.settings import InferenceSettings
from workloads.inference.workload import BatchReport, InferenceWorkload

console = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    try:
        settings = CliApp.run(InferenceSettings, cli_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/red] {exc}")
        return 2
    try:
        workload = InferenceWorkload(settings)
    except (ValueError, OSError) as exc:
        console.print(f"[red]cannot start:[/red] {exc}")
        return 2

    def show(r: BatchReport) -> None:
        if settings.json_output:
            print(r.model_dump_json(), flush=True)
            return
        table = Table("file", "step", "batch", "rows", "tokens", "tok/s", "reward", "proof s")
        table.add_row(
            r.path, str(r.step), str(r.batch_counter), str(r.rows), str(r.work_units),
            f"{r.tokens_per_second:.0f}", f"{r.reward_mean:.3f}", f"{r.proof_seconds:.3f}",
        )  # fmt: skip
        Console().print(table)

    try:
        workload.run(show)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
