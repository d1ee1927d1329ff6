"""Where the suite's time goes: every test's set-up, call and tear-down, and every fixture set-up.

A pytest plugin (loaded by `pyproject.toml`'s addopts). `--profile PATH` writes a JSON record of the
run and prints its most expensive items at the end; `python -m tests.support.timing PATH [BEFORE]`
prints the table again (side by side with an earlier record when BEFORE is given), as
docs/testing.md shows it.

Under pytest-xdist the workers take whole modules (`--dist loadscope`, so a module's fixtures are set
up once), the longest first: the order comes from `tests/durations.json` (seconds per module, from
the last `make test-profile`; a module missing from it goes last, in collection order). Longest
first keeps one long module from starting last and holding the whole run.

Why fixtures apart from tests: pytest's own `--durations` counts a module fixture inside the set-up
of whichever test came first, so a devnet started five times looks like five slow tests. Here each
fixture set-up is an item of its own, named by the fixture, its scope and where it was set up, and a
devnet started five times counts five times. Works under pytest-xdist: the workers attach their
fixture timings to the test's report (`user_properties`), which xdist carries to the controller.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_KEY = "intellect-fixture"
_current: list[pytest.Item] = []
DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("intellect timing")
    group.addoption("--profile", default=None, metavar="PATH",
                    help="write every test's and fixture set-up's time to PATH (JSON); print the top items")
    group.addoption("--profile-top", type=int, default=30, metavar="N",
                    help="how many of the most expensive items to print with --profile (default 30)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers: modules in order of their recorded duration, longest first (stable: the tests
    of a module keep their order). Every worker reads the same file, so all collect the same order."""
    if not hasattr(config, "workerinput") or not DURATIONS.exists():
        return
    seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    first_seen: dict[str, int] = {}
    for n, item in enumerate(items):
        first_seen.setdefault(_module(item.nodeid), n)
    items.sort(key=lambda i: (-seconds.get(_module(i.nodeid), 0.0), first_seen[_module(i.nodeid)]))


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _current.append(item)
    try:
        yield
    finally:
        _current.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Generator[
        None, None, None]:  # fmt: skip
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    if _current and seconds >= 0.05:  # the many trivial fixtures would only make the record long
        where = _where(request, fixturedef.scope)
        entry = f"{fixturedef.argname}|{fixturedef.scope}|{where}|{seconds:.3f}"
        _current[-1].user_properties.append((_KEY, entry))


def _where(request: pytest.FixtureRequest, scope: str) -> str:
    """The node the fixture was set up for: its module (or class, package) for wider scopes."""
    return "session" if scope == "session" else str(getattr(request.node, "nodeid", "") or "")


class _Recorder:
    def __init__(self, path: Path, top: int) -> None:
        self.path = path
        self.top = top
        self.started = time.time()
        self.tests: dict[str, dict[str, float]] = defaultdict(dict)
        self.outcomes: dict[str, str] = {}
        self.fixtures: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tests[report.nodeid][report.when] = round(report.duration, 3)
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome
        if report.when != "setup":
            return
        for key, value in report.user_properties:
            if key != _KEY:
                continue
            name, scope, where, seconds = str(value).rsplit("|", 3)
            self.fixtures.append({"fixture": name, "scope": scope, "where": where, "test": report.nodeid,
                                  "seconds": float(seconds)})

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        record = {"wall_seconds": round(time.time() - self.started, 1), "tests": self.tests,
                  "outcomes": self.outcomes, "fixtures": self.fixtures}
        self.path.write_text(json.dumps(record, indent=1))
        terminalreporter.write_sep("=", f"the {self.top} most expensive items (full record: {self.path})")
        for line in table(items(record), self.top):
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--profile")
    if path and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) records
        recorder = _Recorder(Path(path), config.getoption("--profile-top"))
        config.pluginmanager.register(recorder, "intellect-timing")


@dataclass(frozen=True)
class Item:
    """One line of the table: a test's call or tear-down, or one fixture set-up."""

    kind: str  # "test", "fixture", "teardown"
    name: str
    seconds: float


def items(record: dict[str, Any]) -> list[Item]:
    """A record's items, most expensive first. A test's set-up time is shown through its fixtures (what
    is left of it after them, when over a second, as a `setup` item)."""
    fixture_seconds: dict[str, float] = defaultdict(float)
    out: list[Item] = []
    for f in record["fixtures"]:
        where = f["where"] if f["scope"] != "function" else f["test"]
        out.append(Item("fixture", f"{f['fixture']} ({f['scope']}) @ {where}", f["seconds"]))
        fixture_seconds[f["test"]] += f["seconds"]
    for nodeid, phases in record["tests"].items():
        out.append(Item("test", nodeid, phases.get("call", 0.0)))
        rest = phases.get("setup", 0.0) - fixture_seconds[nodeid]
        if rest > 1.0:
            out.append(Item("setup", nodeid, rest))
        if phases.get("teardown", 0.0) > 1.0:
            out.append(Item("teardown", nodeid, phases["teardown"]))
    return sorted(out, key=lambda i: -i.seconds)


def table(rows: Iterable[Item], top: int, before: dict[str, float] | None = None) -> list[str]:
    rows = list(rows)
    total = sum(r.seconds for r in rows)
    head = "|  # | seconds | share | kind | item |" if before is None else \
        "|  # | seconds | before | kind | item |"
    lines = [head, "|---:|---:|---:|---|---|"]
    for n, r in enumerate(rows[:top], 1):
        third = f"{100 * r.seconds / max(total, 1e-9):.1f} %" if before is None else \
            (f"{before[r.name]:.0f}" if r.name in before else "new")
        lines.append(f"| {n} | {r.seconds:.1f} | {third} | {r.kind} | `{r.name}` |")
    shown = sum(r.seconds for r in rows[:top])
    lines.append(f"the top {min(top, len(rows))}: {shown:.0f} s of {total:.0f} s in {len(rows)} items")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.timing", description=__doc__)
    parser.add_argument("record", type=Path, help="a JSON record written by `pytest --profile PATH`")
    parser.add_argument("before", type=Path, nargs="?", help="an earlier record, to show side by side")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--write-durations", type=Path, metavar="FILE",
                        help="write each module's seconds (set-up, calls, tear-down) to FILE")
    args = parser.parse_args(argv)
    record = json.loads(args.record.read_text())
    if args.write_durations:
        per_module: dict[str, float] = defaultdict(float)
        for nodeid, phases in record["tests"].items():
            per_module[_module(nodeid)] += sum(phases.values())
        ordered = dict(sorted(((m, round(v, 1)) for m, v in per_module.items()), key=lambda kv: -kv[1]))
        args.write_durations.write_text(json.dumps(ordered, indent=1) + "\n")
        print(f"wrote {len(ordered)} modules' seconds to {args.write_durations}")
    before = None
    if args.before:
        old = json.loads(args.before.read_text())
        before = {i.name: i.seconds for i in items(old)}
        print(f"before: wall {old['wall_seconds']:.0f} s, {len(old['tests'])} tests")
    print(f"now: wall {record['wall_seconds']:.0f} s, {len(record['tests'])} tests")
    print("\n".join(table(items(record), args.top, before)))


if __name__ == "__main__":
    main()
