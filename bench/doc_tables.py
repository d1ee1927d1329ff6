"""Tables the docs quote, written by the bench that measures them.

A doc holds a generated table between `<!-- bench/NAME.py[ TAG]: start -->` and `... end -->`; a bench
run with `--write-doc` replaces what is between the markers, so a figure in the docs is always one a
bench printed (with the command, the date and the machine's load above it)."""

from __future__ import annotations

from pathlib import Path


def markers(bench: str, tag: str = "") -> tuple[str, str]:
    name = f"{bench} {tag}".strip()
    return f"<!-- {name}: start -->", f"<!-- {name}: end -->"


def write_block(doc: Path, bench: str, body: str, tag: str = "") -> None:
    start, end = markers(bench, tag)
    text = doc.read_text()
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        raise SystemExit(f"{doc}: no {start} … {end} markers to write between")
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{start}\n{body.strip()}\n{end}{tail}")


def read_block(doc: Path, bench: str, tag: str = "") -> str:
    start, end = markers(bench, tag)
    return doc.read_text().split(start, 1)[1].split(end, 1)[0]


def markdown_table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(header)))
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]  # fmt: skip
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
