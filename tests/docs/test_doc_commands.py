"""The docs cannot drift from the code: every command line in README.md and docs/ names flags and
subcommands its program really has, and every code block the doc tests skip says so where a reader
sees it. (The blocks that can run here run as written: `conftest.py` at the root, Sybil.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.docs import commands
from tests.docs.commands import DOCS, Command, all_problems, check, commands_in


def test_every_documented_command_uses_flags_its_program_has() -> None:
    problems = all_problems()
    assert problems == [], "\n".join(str(p) for p in problems)


def test_the_check_reads_commands_in_every_form_the_docs_use(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text(
        "Run `intellect-validator run --pool 1 --bogus-inline` first.\n\n"
        "```bash\nX=1 .venv/bin/intellect devnet up \\\n    --demo --no-such-flag\n```\n\n"
        "Then:\n\n    python -m workloads.inference --max-new-tokens 8 --max-new-tokenz 8\n"
    )
    found = sorted((p.program, p.flag) for c in commands_in(doc) for p in check(c))
    assert found == [
        ("intellect devnet up", "--no-such-flag"),
        ("intellect-infer", "--max-new-tokenz"),
        ("intellect-validator run", "--bogus-inline"),
    ]
    assert [p.flag for p in check(Command("x", 1, "intellect devnet upp"))] == ["subcommand 'upp'"]
    assert check(Command("x", 1, "intellect-pool --rpc-url URL --deployment D --json pool 1")) == []


def test_renaming_a_flag_in_the_code_fails_the_docs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if `intellect-validator run --step-url` were renamed `--trainer-url` in the code: the README's
    RL loop and docs/validator.md still say --step-url, and the check names both places."""
    real = typer.main.get_command

    def renamed(app: typer.Typer) -> Any:
        command = real(app)
        run = getattr(command, "commands", {}).get("run")
        for param in getattr(run, "params", []):
            if "--step-url" in getattr(param, "opts", []):
                param.opts = ["--trainer-url"]
        return command

    monkeypatch.setattr(commands.typer.main, "get_command", renamed)
    stale = {(p.command.doc, p.flag) for p in all_problems() if p.program == "intellect-validator run"}
    assert ("README.md", "--step-url") in stale and ("docs/validator.md", "--step-url") in stale


def test_every_skipped_block_says_so_visibly() -> None:
    """A `<!-- skip: next "why" -->` marker is invisible once rendered: the line before it tells the
    reader the block is not run, and why."""
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            marker = re.match(r'<!-- skip: next "(.+)" -->', line)
            if marker:
                note = lines[i - 1] if i else ""
                assert note == f"*Not run by the doc tests: {marker.group(1)}.*", f"{doc.name}:{i + 1}"
