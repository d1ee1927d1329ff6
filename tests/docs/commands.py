"""Every command line the README and docs/ show, checked against the CLIs it names.

A command is found in fenced `bash`/`sh`/`console` blocks, indented code blocks and inline code
spans; continuation lines are joined, pipelines and `&&`/`;`/`&` lists split. For each of this
project's programs (the console scripts of pyproject.toml, `python -m workloads.inference`) the
subcommand path is followed through the typer app (or the pydantic-settings model, for the two
workloads whose flags are their settings' fields) and every `--flag` must be one the program takes.
So renaming a flag in the code without the docs fails `tests/docs/test_doc_commands.py`.
"""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import typer
from pydantic_settings import BaseSettings

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
MODULE_ALIASES = {"workloads.inference": "intellect-infer", "workloads.trainer": "intellect-train"}
# Flags these programs take outside their settings model (see their __main__).
EXTRA_FLAGS = {"intellect-train": {"--cpu-demo"}}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str


@dataclass(frozen=True)
class Problem:
    command: Command
    program: str
    flag: str

    def __str__(self) -> str:
        where = f"{self.command.doc}:{self.command.line}"
        return f"{where}: {self.program} has no {self.flag}: {self.command.text}"


def _scripts() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(project["scripts"])


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def commands_in(path: Path) -> list[Command]:
    """Command lines of one markdown file: fenced shell blocks, indented blocks, inline spans."""
    text = path.read_text()
    doc = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    found: list[Command] = []
    fenced = list(re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.S | re.M))
    for m in fenced:
        if m.group(1).lower() in SHELL_LANGS:
            found += _logical_lines(doc, m.group(2), _line_of(text, m.start(2)))
    outside = text
    for m in reversed(fenced):  # blank out fenced blocks so spans and indents are read elsewhere
        outside = outside[: m.start()] + "\n" * m.group(0).count("\n") + outside[m.end() :]
    for m in re.finditer(r"(?:^(?: {4}|\t).*\n?)+", outside, re.M):
        if not _inside_list(outside, m.start()):
            block = re.sub(r"^(?: {4}|\t)", "", m.group(0), flags=re.M)
            found += _logical_lines(doc, block, _line_of(outside, m.start()))
    for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", outside):
        found.append(Command(doc, _line_of(outside, m.start()), m.group(1).strip()))
    return found


def _inside_list(text: str, offset: int) -> bool:
    """An indented paragraph that continues a list item is prose, not code."""
    before = text[:offset].rstrip("\n").splitlines()
    return bool(before) and bool(re.match(r"^\s*([-*+]|\d+\.)\s|^\s{2,}\S", before[-1]))


def _logical_lines(doc: str, block: str, first_line: int) -> list[Command]:
    out: list[Command] = []
    pending, start = "", first_line
    for i, raw in enumerate(block.splitlines()):
        line = raw.rstrip()
        if not pending:
            start = first_line + i
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(Command(doc, start, (pending + line).strip()))
        pending = ""
    if pending:
        out.append(Command(doc, start, pending.strip()))
    return out


def _simple_commands(text: str) -> list[list[str]]:
    text = re.sub(r"(?<!\S)#.*$", "", text)  # a trailing comment
    text = re.sub(r"\$\([^()]*\)", "X", text)  # command substitutions stand for one word
    parts = re.split(r"\|\||&&|[|;&]|\$\(|\)", text)
    words: list[list[str]] = []
    for part in parts:
        try:
            tokens = shlex.split(part)
        except ValueError:
            tokens = part.split()
        if tokens:
            words.append(tokens)
    return words


def _program(tokens: list[str]) -> tuple[str, list[str]] | None:
    """Our program named by a simple command, and its arguments; None for anything else."""
    scripts = _scripts()
    i = 0
    while i < len(tokens) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[i]):
        i += 1  # leading VAR=value assignments
    if i >= len(tokens):
        return None
    name = tokens[i].removeprefix(".venv/bin/").removeprefix("./.venv/bin/")
    if name in scripts:
        return name, tokens[i + 1 :]
    if re.fullmatch(r"(\.venv/bin/)?python3?", tokens[i]) and tokens[i + 1 : i + 2] == ["-m"]:
        module = tokens[i + 2] if len(tokens) > i + 2 else ""
        if module in MODULE_ALIASES:
            return MODULE_ALIASES[module], tokens[i + 3 :]
    return None


@cache
def _typer_app(program: str) -> typer.Typer | None:
    module = importlib.import_module(_scripts()[program].split(":")[0])
    app = getattr(module, "app", None)
    return app if isinstance(app, typer.Typer) else None


@cache
def _settings_flags(program: str) -> frozenset[str]:
    module = importlib.import_module(_scripts()[program].split(":")[0])
    models = [v for v in vars(module).values()
              if isinstance(v, type) and issubclass(v, BaseSettings) and v is not BaseSettings]  # fmt: skip
    flags = {"--help", "-h", *EXTRA_FLAGS.get(program, set())}
    for model in models:
        for name, field in model.model_fields.items():
            flag = "--" + name.replace("_", "-")
            flags.add(flag)
            if field.annotation is bool:
                flags.add("--no-" + name.replace("_", "-"))
    return frozenset(flags)


def _click_options(command: Any) -> set[str]:
    return set(_takes_value(command))


def _takes_value(command: Any) -> dict[str, bool]:
    """Each `--option` of a command, and whether a value follows it."""
    names = {"--help": False}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("--"):
                    names[opt] = not (param.is_flag or opt in param.secondary_opts)
    return names


def _flags(tokens: list[str]) -> list[str]:
    flags = []
    for token in tokens:
        token = token.strip("[](),.…'\"")
        if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", token):
            flags.append(token.split("=", 1)[0])
    return flags


def check(command: Command) -> list[Problem]:
    problems: list[Problem] = []
    for tokens in _simple_commands(command.text):
        found = _program(tokens)
        if found is None:
            continue
        program, args = found
        app = _typer_app(program)
        if app is None:
            known = _settings_flags(program)
            problems += [Problem(command, program, f) for f in _flags(args) if f not in known]
            continue
        cmd: Any = typer.main.get_command(app)  # typer's own click: duck-typed below
        path = [program]
        # options may come before the subcommand (the group's own) or after it (the command's)
        allowed = _click_options(cmd)
        rest = list(args)
        while rest:
            word = rest.pop(0)
            if word.startswith("--") and "=" not in word and _takes_value(cmd).get(word) and rest:
                rest.pop(0)  # the option's value
                continue
            group = hasattr(cmd, "commands")
            if group and not word.startswith("-") and word in cmd.commands:
                cmd = cmd.commands[word]
                path.append(word)
                allowed |= _click_options(cmd)
            elif group and not word.startswith("-") and word.isidentifier():
                problems.append(Problem(command, " ".join(path), f"subcommand {word!r}"))
                break
        problems += [Problem(command, " ".join(path), f) for f in _flags(args) if f not in allowed]
    return problems


def all_problems(docs: list[Path] = DOCS) -> list[Problem]:
    return [p for doc in docs for c in commands_in(doc) for p in check(c)]
