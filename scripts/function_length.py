"""No function or method in the product packages longer than 80 lines (`make lint` runs this).

A function is counted from its `def` line through its last line (`end_lineno`), both included:
docstring, comments and blank lines count, decorators do not, and a nested function counts both on
its own and as part of the function around it. Ruff's PLR0915 counts statements instead, which lets a
function grow long by wrapping, comments or one long literal; what a reader has to keep in view is
lines.

Why 80: about one screen, so a function can be read without scrolling. The functions over it that
issue 60 found were each several steps run one after another, steps with names of their own; split
out, each step is named and a test can reach it without driving the rest. The limit is a ceiling,
not a target.

The product packages are the ones that ship (pyproject.toml's packages, and deploy/); tests/,
bench/ and examples/ are not checked, nor Alembic's migrations (generated, one function a revision).
Prints `path:line name (N lines)` for each function over the limit, and exits 1 when there is one:

    .venv/bin/python scripts/function_length.py               # the product packages
    .venv/bin/python scripts/function_length.py workloads/pipeline --max 60
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 80
PACKAGES = (
    "intellect", "ledger", "workloads", "validator", "orchestrator", "worker", "discovery", "dashboard",
    "devnet", "deploy",
)  # fmt: skip
"""Top-level folders of the repository checked when no path is given."""
SKIPPED = frozenset({"tests", "bench", "examples", "migrations", "__pycache__", "node_modules"})
"""Folder names never walked into, wherever they are (`migrations` holds Alembic's revisions)."""


@dataclass(frozen=True)
class LongFunction:
    path: Path
    line: int
    name: str  # qualified within its module: Class.method, outer.inner
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.lines} lines)"


def python_files(root: Path) -> Iterator[Path]:
    """`root` itself if it is a file, else every .py below it outside the SKIPPED folders, sorted."""
    if root.is_file():
        yield root
        return
    for path in sorted(root.rglob("*.py")):
        if not SKIPPED.intersection(path.relative_to(root).parts[:-1]):
            yield path


Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function and method in `tree` with its qualified name, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, Function):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def long_functions(paths: list[Path], max_lines: int = MAX_LINES, base: Path = REPO) -> list[LongFunction]:
    """The functions over `max_lines` lines in the files under `paths`, named relative to `base`
    where they lie below it."""
    found = []
    for root in paths:
        for path in python_files(root):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            shown = path.relative_to(base) if path.is_relative_to(base) else path
            for name, node in functions(tree):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > max_lines:
                    found.append(LongFunction(shown, node.lineno, name, lines))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="*", type=Path, help="files or folders (default: the product packages)"
    )
    parser.add_argument(
        "--max", type=int, default=MAX_LINES, help=f"most lines a function may have: {MAX_LINES}"
    )
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.paths] or [REPO / name for name in PACKAGES if (REPO / name).is_dir()]
    found = long_functions(paths, args.max)
    for item in found:
        print(item)
    if found:
        advice = "split each into parts with names of their own"
        print(f"{len(found)} function(s) over {args.max} lines: {advice}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
