"""TOPLOC proofs in the reference toploc 0.1.x byte format (see docs/toploc.md).

Native API: `build_proof(hidden) -> bytes`, `verify_proof(hidden, proof, thresholds) -> Verdict`.
Drop-in for the reference: `build_proofs_bytes`, `verify_proofs_bytes` and friends.
"""

from workloads.toploc.codec import ChunkProof, ProofFormatError
from workloads.toploc.compat import (
    ProofPoly,
    VerificationResult,
    build_proofs,
    build_proofs_base64,
    build_proofs_bytes,
    verify_proofs,
    verify_proofs_base64,
    verify_proofs_bytes,
)
from workloads.toploc.field import ModulusNotFoundError, P
from workloads.toploc.proof import (
    CHUNK_SIZE,
    TOPK,
    ChunkResult,
    Verdict,
    build_proof,
    build_proofs_batch,
    chunk_layout,
    verify_proof,
    verify_proofs_batch,
)
from workloads.toploc.settings import ToplocThresholds

__all__ = [
    "CHUNK_SIZE",
    "P",
    "TOPK",
    "ChunkProof",
    "ChunkResult",
    "ModulusNotFoundError",
    "ProofFormatError",
    "ProofPoly",
    "ToplocThresholds",
    "Verdict",
    "VerificationResult",
    "build_proof",
    "build_proofs",
    "build_proofs_base64",
    "build_proofs_batch",
    "build_proofs_bytes",
    "chunk_layout",
    "verify_proof",
    "verify_proofs",
    "verify_proofs_base64",
    "verify_proofs_batch",
    "verify_proofs_bytes",
]
