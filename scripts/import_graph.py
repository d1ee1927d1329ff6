"""The import graph's circles and upward imports, as the note of issue 39 reports them.

A circle is a set of modules that import each other round (a strongly connected component of the
module graph, lazy imports inside functions included: grimp reads every import statement). An upward
import runs from a lower layer to a higher one of the order in pyproject.toml's import-linter
contract (`make lint` refuses those; this prints them with the circles so both figures come from one
run). Prints a table, or `--json`.

    .venv/bin/python scripts/import_graph.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]


def layers() -> tuple[list[str], list[list[str]]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    order = [[name.strip() for name in layer.split("|")] for layer in reversed(contract["layers"])]
    return list(config["root_packages"]), order  # lowest layer first


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(graph: grimp.ImportGraph, order: list[list[str]]) -> list[str]:
    level = {package: i for i, layer in enumerate(order) for package in layer}
    edges = []
    for module in sorted(graph.modules):
        top = module.split(".")[0]
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            target = imported.split(".")[0]
            if top in level and target in level and level[target] > level[top]:
                edges.append(f"{module} -> {imported}")
    return edges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    roots, order = layers()
    graph = grimp.build_graph(*roots, include_external_packages=False, cache_dir=None)
    found, up = circles(graph), upward(graph, order)
    across = [c for c in found if len({m.split(".")[0] for m in c}) > 1]
    if args.json:
        print(json.dumps({"modules": len(graph.modules), "circles": found, "circles_across_packages": across,
                          "upward_imports": up}, indent=1))  # fmt: skip
    else:
        layer_names = " < ".join("|".join(x) for x in order)
        print(f"{len(graph.modules)} modules; layers (lowest first): {layer_names}")
        print(f"circles: {len(found)} ({len(across)} across top-level packages)")
        for c in found:
            print(f"  {len(c)} modules: {', '.join(c)}")
        print(f"upward imports: {len(up)}")
        for edge in up:
            print(f"  {edge}")
    return 1 if found or up else 0


if __name__ == "__main__":
    raise SystemExit(main())
