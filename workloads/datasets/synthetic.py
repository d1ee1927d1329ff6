"""Synthetic demo tasks the tiny model can learn: addition, string reversal, digit sorting.

Prompts are short and end with "=", the answer follows directly and ends with EOS, so a
character-level model of a few hundred thousand weights learns them in a few CPU minutes.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np

from workloads.verifiers.records import SYNTHETIC_TYPES, TaskRecord


def make_task(task_type: str, rng: np.random.Generator, problem_id: str) -> TaskRecord:
    if task_type == "arithmetic":
        a, b = (int(x) for x in rng.integers(0, 100, 2))
        prompt, answer = f"{a}+{b}=", str(a + b)
    elif task_type == "reverse":
        word = "".join(rng.choice(list(string.ascii_lowercase), int(rng.integers(3, 7))))
        prompt, answer = f"rev {word}=", word[::-1]
    elif task_type == "sort":
        digits = "".join(rng.choice(list(string.digits), int(rng.integers(3, 7))))
        prompt, answer = f"sort {digits}=", "".join(sorted(digits))
    else:
        raise ValueError(f"unknown synthetic task type {task_type!r}; expected one of {SYNTHETIC_TYPES}")
    return TaskRecord(
        problem_id=problem_id, task_type=task_type, prompt=prompt, verification_info={"answer": answer}
    )


def make_tasks(
    count: int, seed: int, prefix: str = "demo", types: tuple[str, ...] = SYNTHETIC_TYPES
) -> list[TaskRecord]:
    rng = np.random.default_rng(seed)
    chosen = rng.choice(list(types), count)
    return [make_task(str(t), rng, f"{prefix}-{i:05d}") for i, t in enumerate(chosen)]


def write_jsonl(records: list[TaskRecord], path: Path) -> None:
    path.write_text("".join(json.dumps(r.model_dump()) + "\n" for r in records))


if __name__ == "__main__":  # regenerates the shipped sets
    write_jsonl(make_tasks(512, seed=20250101), Path(__file__).with_name("demo.jsonl"))
    # The RL demo: string reversal only, which the shipped model solves about 29 % of the time.
    write_jsonl(make_tasks(512, 20250102, "reverse", ("reverse",)), Path(__file__).with_name("reverse.jsonl"))
