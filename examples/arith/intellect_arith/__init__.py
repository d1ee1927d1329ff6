"""Verifiable arithmetic: a workload written against the protocol's public seam only.

A node is handed problems nobody else gets (derived from the task, its own address and a file
counter), computes `pow(a, b, m)` for each, and writes a JSON file of answers; a validator derives
the same problems, recomputes every answer and decides. A wrong answer is an exact fact (no floating
point, no noise), so a file with one is invalidated and its node slashed.

- `problems.py`: the problems, their answers and the file format (shared by node and judge)
- `__main__.py`: the program workers run (`python -m intellect_arith`)
- `plugin.py`: the plug-in the orchestrator and the validators load (entry point `arith`)
"""
