"""The reference byte format: per chunk, modulus u16 BE then coefficients u16 BE (ascending)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workloads.toploc.field import P, evaluate


class ProofFormatError(ValueError):
    """Proof bytes that cannot be a chunk proof (odd length, too short)."""


def encode_rows(moduli: np.ndarray, coeffs: np.ndarray) -> list[bytes]:
    """One proof per row: 2 + 2 x n bytes each."""
    if coeffs.shape[0] == 0:
        return []
    table = np.concatenate([moduli[:, None], coeffs], axis=1).astype(">u2")
    raw = table.tobytes()
    width = 2 * table.shape[1]
    return [raw[i : i + width] for i in range(0, len(raw), width)]


def decode_rows(proofs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(moduli, coefficients padded with zero high-degree terms) from a list of chunk proofs."""
    for i, proof in enumerate(proofs):
        if len(proof) < 4 or len(proof) % 2:
            raise ProofFormatError(
                f"chunk proof {i} is {len(proof)} bytes: needs an even length of at least 4 "
                "(2-byte modulus and 2-byte coefficients)"
            )
    width = max((len(p) // 2 - 1 for p in proofs), default=0)
    moduli = np.zeros(len(proofs), dtype=np.int64)
    coeffs = np.zeros((len(proofs), width), dtype=np.int64)
    for i, proof in enumerate(proofs):  # loop over chunks; each row decodes in one vector step
        words = np.frombuffer(proof, dtype=">u2").astype(np.int64)
        moduli[i] = words[0]
        coeffs[i, : words.size - 1] = words[1:]
    return moduli, coeffs


class ChunkProof(BaseModel):
    """One chunk's proof polynomial, the reference's `ProofPoly`."""

    model_config = ConfigDict(frozen=True)

    modulus: int = Field(ge=0, le=0xFFFF, description="indices are reduced mod this before evaluation")
    coeffs: list[int] = Field(description="monomial coefficients over GF(65497), ascending degree")

    @classmethod
    def from_bytes(cls, data: bytes) -> ChunkProof:
        moduli, coeffs = decode_rows([data])
        return cls(modulus=int(moduli[0]), coeffs=coeffs[0].tolist())

    @classmethod
    def null(cls, length: int) -> ChunkProof:
        """What the reference emits when it cannot build proofs: modulus 0, zero coefficients."""
        return cls(modulus=0, coeffs=[0] * length)

    def to_bytes(self) -> bytes:
        return encode_rows(np.array([self.modulus]), np.array([self.coeffs], dtype=np.int64))[0]

    def __call__(self, index: int) -> int:
        """Value committed for flattened-chunk index `index` (reduced mod the modulus)."""
        if self.modulus <= 0:
            raise ValueError("a null proof (modulus 0) commits to no values")
        x = np.array([[index % self.modulus]], dtype=np.int64)
        return int(evaluate(np.array([self.coeffs], dtype=np.int64), x)[0, 0]) % P

    def __len__(self) -> int:
        return len(self.coeffs)
