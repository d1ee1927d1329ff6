"""Batch trees in the layout of OpenZeppelin's StandardMerkleTree (`@openzeppelin/merkle-tree`).

A work batch commits to its files with the root of a standard tree over `(bytes32 workKey, uint256
units)` leaves, built with `sortLeaves: false` so leaf i is the batch's i-th file (the order the
uploader made them in, which validators keep when they judge). The layout is OpenZeppelin's, not ours:

- a leaf is `keccak256(keccak256(abi.encode(workKey, units)))` (double hashed: no 64-byte leaf can
  pass for an inner node);
- the tree is one array of `2n - 1` hashes, leaf i at `len - 1 - i`, node i the commutative keccak of
  nodes `2i + 1` and `2i + 2` (the smaller first), the root at 0;
- a proof is the sibling hashes from the leaf up, checked by `MerkleProof.verify` on chain.

`ComputePool.submitWorkBatch` rebuilds the same root from the calldata and refuses a batch whose root
differs; tests/ledger/test_merkle.py checks this module against the npm package itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eth_abi import encode
from eth_utils import keccak

MAX_BATCH = 256  # ComputePool.MAX_BATCH: files per submitWorkBatch


def leaf_hash(work_key: bytes, units: int) -> bytes:
    if len(work_key) != 32:
        raise ValueError(f"a work key is 32 bytes, got {len(work_key)}")
    if not 0 <= units < 2**256:
        raise ValueError(f"units out of uint256 range: {units}")
    return keccak(keccak(encode(["bytes32", "uint256"], [work_key, units])))


def node_hash(a: bytes, b: bytes) -> bytes:
    return keccak(min(a, b) + max(a, b))


@dataclass(frozen=True)
class BatchTree:
    """The standard tree of one batch: `root`, and `proof(i)` for its i-th file."""

    leaves: tuple[tuple[bytes, int], ...]
    tree: tuple[bytes, ...]

    @classmethod
    def of(cls, leaves: Sequence[tuple[bytes, int]]) -> BatchTree:
        if not leaves:
            raise ValueError("a batch tree needs at least one leaf")
        n = len(leaves)
        tree: list[bytes] = [b""] * (2 * n - 1)
        for i, (key, units) in enumerate(leaves):
            tree[len(tree) - 1 - i] = leaf_hash(key, units)
        for i in range(len(tree) - 1 - n, -1, -1):
            tree[i] = node_hash(tree[2 * i + 1], tree[2 * i + 2])
        return cls(leaves=tuple((bytes(k), int(u)) for k, u in leaves), tree=tuple(tree))

    @property
    def root(self) -> bytes:
        return self.tree[0]

    def proof(self, index: int) -> list[bytes]:
        if not 0 <= index < len(self.leaves):
            raise IndexError(f"leaf {index} of a batch of {len(self.leaves)}")
        at = len(self.tree) - 1 - index
        out: list[bytes] = []
        while at > 0:
            out.append(self.tree[at + 1] if at % 2 == 1 else self.tree[at - 1])
            at = (at - 1) // 2
        return out


def verify(root: bytes, work_key: bytes, units: int, proof: Sequence[bytes]) -> bool:
    """What `MerkleProof.verify` answers for this leaf and proof."""
    at = leaf_hash(work_key, units)
    for sibling in proof:
        at = node_hash(at, sibling)
    return at == root
