"""Figures the docs quote come from the bench that makes them: docs/contracts.md's gas table is
written by `bench/gas.py --write-doc`, and a fresh run on anvil must agree with it within 10 % in
every row, with no row missing on either side (gas is deterministic for a given compiler and code,
so a change to the contracts shows up here until the table is regenerated)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(name: str) -> ModuleType:
    """A bench script as a module, without putting bench/ first on the path (its validator.py would
    shadow the package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gas = _bench("gas")
doc_tables = _bench("doc_tables")

TOLERANCE = 0.10


def _key_and_figures(contract: str, call: str, gas_text: str) -> tuple[tuple[str, str], dict[str, int]]:
    figures: dict[str, int] = {}
    size = re.search(r"\((\d+) bytes\)", call)
    if size:
        figures["bytes"] = int(size.group(1))
        call = re.sub(r"\s*\(\d+ bytes\)", "", call)
    if gas_text.strip():
        figures["gas"] = int(gas_text.replace(",", ""))
    return (contract.strip(), call.strip()), figures


def doc_rows(doc: Path = gas.DOC) -> dict[tuple[str, str], dict[str, int]]:
    text = doc.read_text()
    block = text.split(gas.START, 1)[1].split(gas.END, 1)[0]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        contract, call, gas_text = (c.strip() for c in line.strip().strip("|").split("|"))
        key, figures = _key_and_figures(contract, call, gas_text)
        rows[key] = figures
    return rows


@pytest.mark.slow
def test_the_gas_table_is_what_the_bench_measures() -> None:
    measured = {}
    for row in gas.measure():
        key, figures = _key_and_figures(str(row["contract"]), str(row["call"]), f"{row['gas'] or ''}")
        measured[key] = figures
    documented = doc_rows()
    assert sorted(set(measured) - set(documented)) == [], "rows the bench measures but the doc lacks"
    assert sorted(set(documented) - set(measured)) == [], "rows the doc shows that the bench no longer has"
    off = {
        f"{key} {what}": (documented[key].get(what), value)
        for key, figures in measured.items()
        for what, value in figures.items()
        if abs(documented[key].get(what, 0) - value) > TOLERANCE * value
    }
    assert off == {}, f"docs/contracts.md vs bench/gas.py (doc, bench); run bench/gas.py --write-doc: {off}"


def test_the_doc_table_parses() -> None:
    rows = doc_rows()
    assert len(rows) > 30 and all(figures for figures in rows.values())


def test_every_generated_block_holds_the_benchs_output() -> None:
    """Each `<!-- bench/X: start -->` block in the docs is filled, by a bench that exists."""
    read_block = doc_tables.read_block
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for bench, tag in re.findall(r"<!-- (bench/[a-z_]+\.py) ?([^:]*): start -->", doc.read_text()):
            assert (REPO / bench).is_file(), f"{doc.name}: {bench} does not exist"
            body = read_block(doc, bench, tag)
            assert "|---" in body, f"{doc.name}: the {bench} {tag} block is empty; run {bench} --write-doc"
