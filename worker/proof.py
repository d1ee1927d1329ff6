"""The worker's side of the hardware challenge (intellect/hardware.py, docs/hardware.md): build A and B
from the challenge, compute C = A·B on this node's device, commit to C's rows, and answer the probe.

One challenge is held at a time (a new one replaces it) and for `HOLD_SECONDS` at most: C of the
largest size is 256 MiB. The product runs in a thread so the API keeps answering heartbeats' peers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from intellect import hardware
from intellect.wire.hardware import (
    HardwareAnswer,
    HardwareChallenge,
    HardwareCommitment,
    HardwareReveal,
    answer_text,
    commitment_text,
)

HOLD_SECONDS = 300.0


class UnknownChallenge(LookupError):
    """A reveal for a challenge this node does not hold (never asked, replaced, or expired)."""


@dataclass
class _Held:
    challenge: HardwareChallenge
    product: np.ndarray
    levels: list[list[bytes]]
    at: float


class HardwareProver:
    """Answers challenges with the node's key (`sign`: the node wallet's `sign_message`)."""

    def __init__(self, node_address: str, sign: Callable[[str], str], device: str = "cpu") -> None:
        self.node_address = node_address
        self.sign = sign
        self.device = device
        self._lock = threading.Lock()  # one product at a time: two would only halve each other's speed
        self._held: _Held | None = None

    def commit(self, challenge: HardwareChallenge) -> HardwareCommitment:
        with self._lock:
            self._held = None
            started = time.perf_counter()
            a, b = hardware.matrices(challenge.challenge_id, self.node_address, challenge.n,
                                     challenge.precision)
            product = hardware.multiply(a, b, challenge.precision, self.device)
            levels = hardware.merkle_levels(product)
            seconds = time.perf_counter() - started
            self._held = _Held(challenge, product, levels, time.monotonic())
        root = levels[-1][0].hex()
        signature = self.sign(commitment_text(challenge, self.node_address, root))
        return HardwareCommitment(challenge_id=challenge.challenge_id, node_address=self.node_address,
                                  root=root, seconds=round(seconds, 6), signature=signature)  # fmt: skip

    def reveal(self, reveal: HardwareReveal) -> HardwareAnswer:
        with self._lock:
            held = self._held
            if held is None or held.challenge.challenge_id != reveal.challenge_id:
                raise UnknownChallenge(f"challenge {reveal.challenge_id[:16]}… is not the one held here")
            if time.monotonic() - held.at > HOLD_SECONDS:
                self._held = None
                raise UnknownChallenge(f"challenge {reveal.challenge_id[:16]}… expired ({HOLD_SECONDS:.0f}s)")
            self._held = None  # one reveal per challenge: a second probe would open more rows
        probe = hardware.probe(bytes.fromhex(reveal.secret), held.challenge.n, reveal.opened)
        cr, rows, proofs = hardware.answer(held.product, held.levels, probe)
        said = answer_text(reveal.challenge_id, self.node_address, reveal.secret, cr, rows, proofs)
        signature = self.sign(said)
        return HardwareAnswer(challenge_id=reveal.challenge_id, cr=cr, rows=rows, proofs=proofs,
                              signature=signature)  # fmt: skip
