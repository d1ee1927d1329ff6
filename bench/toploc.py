"""TOPLOC proof build and verify time: ours vs the reference toploc library, same activations.

    .venv/bin/python bench/toploc.py            # full grid: 1 and 16 samples x 512/2048 tokens x 896/4096
    .venv/bin/python bench/toploc.py --quick    # a small grid
    .venv/bin/python bench/toploc.py --json     # machine-readable

Ours: `build_proofs_batch` and `verify_proofs_batch` over all samples (one stacked top-k), and
`verify_proof` per sample; the reference: `build_proofs_bytes` / `verify_proofs_bytes` per sample
(its C++ path, which runs one thread per core). Proof bytes are asserted identical to the
reference's. Without the reference library (built from source, `make toploc-ref`) it times ours
only and says why.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

# This file is named toploc.py: drop its own folder from the path so `import toploc` finds the
# reference library, not this script.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from workloads.toploc import (  # noqa: E402
    build_proof,
    build_proofs_batch,
    verify_proof,
    verify_proofs_batch,
)

try:
    import toploc as reference

    reference.build_proofs_bytes  # noqa: B018 - a same-named namespace package is not it
    REFERENCE_MISSING = None
except Exception as exc:  # not installed, or the PyPI wheel that fails with torch 2.13
    reference = None
    REFERENCE_MISSING = f"{type(exc).__name__}: {exc}"

app = typer.Typer(add_completion=False)


class Row(BaseModel):
    samples: int
    tokens: int
    hidden: int
    proof_bytes: int
    ours_build_ms: float
    ours_verify_ms: float  # verify_proofs_batch over all samples
    ours_verify_each_ms: float  # verify_proof per sample
    ref_build_ms: float | None = None
    ref_verify_ms: float | None = None
    build_speedup: float | None = None  # reference time / our time
    verify_speedup: float | None = None
    bytes_identical: bool | None = None


def measure(samples: int, tokens: int, hidden: int, repeats: int) -> Row:
    g = torch.Generator().manual_seed(samples * 100_003 + tokens * 7 + hidden)
    batch = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(samples)]
    ours = build_proofs_batch(batch)
    assert ours == [build_proof(h) for h in batch[:2]] + ours[2:]
    assert all(v.passed for v in verify_proofs_batch(batch, ours))
    pairs = list(zip(batch, ours, strict=True))
    timed = {
        "ours_build": lambda: build_proofs_batch(batch),
        "ours_verify": lambda: verify_proofs_batch(batch, ours),
        "ours_verify_each": lambda: [verify_proof(h, p) for h, p in pairs],
    }
    bytes_identical = None
    if reference is not None:
        theirs = [reference.build_proofs_bytes(h, 32, 128, skip_prefill=True) for h in batch]
        bytes_identical = [b"".join(t) for t in theirs] == ours
        assert bytes_identical, "proof bytes differ from the reference"
        timed["ref_build"] = lambda: [
            reference.build_proofs_bytes(h, 32, 128, skip_prefill=True) for h in batch
        ]
        timed["ref_verify"] = lambda: [
            reference.verify_proofs_bytes(h, t, 32, 128, skip_prefill=True)
            for h, t in zip(batch, theirs, strict=True)
        ]
    # Interleaved repeats, best kept: ours and the reference see the same load on a shared machine.
    best = dict.fromkeys(timed, float("inf"))
    for _ in range(repeats):
        for name, fn in timed.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], 1000 * (time.perf_counter() - start))
    row = Row(
        samples=samples,
        tokens=tokens,
        hidden=hidden,
        proof_bytes=sum(map(len, ours)),
        ours_build_ms=best["ours_build"],
        ours_verify_ms=best["ours_verify"],
        ours_verify_each_ms=best["ours_verify_each"],
        bytes_identical=bytes_identical,
    )
    if reference is not None:
        row.ref_build_ms, row.ref_verify_ms = best["ref_build"], best["ref_verify"]
        row.build_speedup = row.ref_build_ms / row.ours_build_ms
        row.verify_speedup = row.ref_verify_ms / row.ours_verify_ms
    return row


def fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


@app.command()
def main(
    quick: bool = typer.Option(False, "--quick", help="1 and 4 samples x 512 tokens x 896/4096"),
    repeats: int = typer.Option(3, min=1, help="timed repeats per figure (best is kept)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    threads: int = typer.Option(0, min=0, help="torch threads (0 = torch's default)"),
) -> None:
    if threads:
        torch.set_num_threads(threads)
    grid = (
        [(s, 512, h) for s in (1, 4) for h in (896, 4096)]
        if quick
        else [(s, t, h) for s in (1, 16) for t in (512, 2048) for h in (896, 4096)]
    )
    rows = [measure(s, t, h, repeats) for s, t, h in grid]
    if as_json:
        print(
            json.dumps(
                {
                    "reference_missing": REFERENCE_MISSING,
                    "threads": torch.get_num_threads(),
                    "load_avg_1m": os.getloadavg()[0],
                    "rows": [r.model_dump() for r in rows],
                },
                indent=1,
            )
        )
        return
    console = Console(width=max(Console().width, 140))
    if REFERENCE_MISSING:
        console.print(
            f"[yellow]reference toploc not importable ({REFERENCE_MISSING}): timing ours only. "
            "Install it with `make toploc-ref`.[/yellow]"
        )
    table = Table(
        title=f"TOPLOC proofs, torch {torch.__version__}, {torch.get_num_threads()} torch threads "
        f"(the reference's C++ verify runs {os.cpu_count()} threads of its own), ms (best of {repeats}), "
        f"load {os.getloadavg()[0]:.1f}"
    )
    for name in (
        "samples",
        "tokens",
        "hidden",
        "proof B",
        "build ours",
        "build ref",
        "ref/ours",
        "verify ours",
        "ours, per sample",
        "verify ref",
        "ref/ours",
        "bytes identical",
    ):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(
            str(r.samples),
            str(r.tokens),
            str(r.hidden),
            str(r.proof_bytes),
            fmt(r.ours_build_ms),
            fmt(r.ref_build_ms),
            fmt(r.build_speedup, "x"),
            fmt(r.ours_verify_ms),
            fmt(r.ours_verify_each_ms),
            fmt(r.ref_verify_ms),
            fmt(r.verify_speedup, "x"),
            "-" if r.bytes_identical is None else str(r.bytes_identical),
        )
    console.print(table)


if __name__ == "__main__":
    app()
