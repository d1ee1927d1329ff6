"""The problems a node is given, their answers, and the file that carries them.

Problem `k` of a node's file number `counter` in task `task_id` is three integers of `digits` decimal
digits, `a`, `b` and `m`, drawn from sha256 of `intellect-arith/1|task|node|counter|k` (stretched
with a block index). The answer is `pow(a, b, m)`. Nobody chooses a problem: a node that submits a
file for another node's problems, another task's, or problems it was not given is caught by deriving
them again; a counter used twice is a repeat of work already paid (the validator's seen-store).

A file is one JSON object (UTF-8):

    {"format": "intellect-arith/1", "task_id": "...", "node": "0x...", "counter": 3, "digits": 30,
     "answers": ["1234...", ...]}

Answers are decimal strings (JSON numbers lose precision past 2**53 in most readers)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "intellect-arith/1"
MAX_DIGITS = 200


class ArithFileError(ValueError):
    """The file is not an arith answer file of this format; `str()` says what is wrong."""


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    m: int

    def answer(self) -> int:
        return pow(self.a, self.b, self.m)


def _number(seed: bytes, digits: int) -> int:
    """A `digits`-digit decimal integer (no leading zero) from `seed`."""
    stream = b""
    block = 0
    while len(stream) * 2 < digits + 8:  # 2 decimal digits a byte, with room
        stream += hashlib.sha256(seed + block.to_bytes(4, "big")).digest()
        block += 1
    low = 10 ** (digits - 1)
    return low + int.from_bytes(stream, "big") % (9 * low)


def problem(task_id: str, node: str, counter: int, k: int, digits: int) -> Problem:
    base = f"{FORMAT}|{task_id}|{node.lower()}|{counter}|{k}".encode()
    return Problem(a=_number(base + b"|a", digits), b=_number(base + b"|b", digits),
                   m=_number(base + b"|m", digits) | 1)  # odd: never 0  # fmt: skip


def problem_key(task_id: str, node: str, counter: int, k: int) -> str:
    """The identity of one problem, for the seen-store: paid once, whoever submits it again."""
    return hashlib.sha256(f"{FORMAT}|{task_id}|{node.lower()}|{counter}|{k}".encode()).hexdigest()


def write_file(path: Path, task_id: str, node: str, counter: int, count: int, digits: int,
               wrong: bool = False) -> Path:  # fmt: skip
    """Solve `count` problems and write the file atomically. `wrong`: a cheater's file (demos and
    tests): the last answer off by one, which saves nothing but is what a node that skips work sends."""
    answers = [problem(task_id, node, counter, k, digits).answer() for k in range(count)]
    if wrong and answers:
        answers[-1] += 1
    body = {"format": FORMAT, "task_id": task_id, "node": node.lower(), "counter": counter,
            "digits": digits, "answers": [str(x) for x in answers]}  # fmt: skip
    part = path.with_suffix(path.suffix + ".part")
    part.write_text(json.dumps(body))
    part.replace(path)
    return path


@dataclass(frozen=True)
class ArithFile:
    task_id: str
    node: str
    counter: int
    digits: int
    answers: list[str]


def read_file(path: Path, max_bytes: int) -> ArithFile:
    """The file, bounded before it is parsed (size) and checked field by field. Raises ArithFileError."""
    size = path.stat().st_size
    if size > max_bytes:
        raise ArithFileError(f"{size} bytes, over the {max_bytes}-byte limit")
    try:
        body: Any = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise ArithFileError(f"not JSON ({str(exc)[:120]})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ArithFileError(f"not an {FORMAT} file")
    task_id, node = body.get("task_id"), body.get("node")
    counter, digits = body.get("counter"), body.get("digits")
    answers = body.get("answers")
    if not isinstance(task_id, str) or not isinstance(node, str):
        raise ArithFileError("task_id and node must be strings")
    if not isinstance(counter, int) or isinstance(counter, bool) or counter < 0:
        raise ArithFileError("counter must be a non-negative integer")
    if not isinstance(digits, int) or isinstance(digits, bool) or not 1 <= digits <= MAX_DIGITS:
        raise ArithFileError(f"digits must be an integer from 1 to {MAX_DIGITS}")
    if not isinstance(answers, list) or not answers:
        raise ArithFileError("answers must be a non-empty list")
    if not all(isinstance(x, str) and x.isdigit() and len(x) <= MAX_DIGITS for x in answers):
        raise ArithFileError(f"every answer must be a decimal string of at most {MAX_DIGITS} digits")
    return ArithFile(task_id=task_id, node=node.lower(), counter=counter, digits=digits, answers=answers)
