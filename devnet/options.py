"""Command-line options the devnet's commands share (one definition, so `--dir` reads alike)."""

from __future__ import annotations

from pathlib import Path

import typer

DirOption = typer.Option(
    Path(".devnet"),
    "--dir",
    envvar="INTELLECT_DEVNET_DIR",
    help="where the devnet keeps its chain state, logs and devnet.json",
)
HostA = typer.Argument(..., help="a host, as `intellect devnet hosts` lists them (e.g. w2)")
HostB = typer.Argument(..., help="the other host (e.g. orch)")
