"""ledger/merkle.py against @openzeppelin/merkle-tree itself (run with node): same roots, same proofs,
for every batch size the uploader can make small and a few large ones, plus the proof checks."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ledger.merkle import BatchTree, leaf_hash, verify

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
const { StandardMerkleTree } = require("@openzeppelin/merkle-tree");
const batches = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = batches.map((leaves) => {
  const tree = StandardMerkleTree.of(leaves, ["bytes32", "uint256"], { sortLeaves: false });
  return { root: tree.root, proofs: leaves.map((_, i) => tree.getProof(i)) };
});
process.stdout.write(JSON.stringify(out));
"""


def leaves(n: int, seed: int) -> list[tuple[bytes, int]]:
    return [(hashlib.sha256(f"{seed}-{i}".encode()).digest(), (i * 7919 + seed) % 5000 + 1) for i in range(n)]


def test_roots_and_proofs_match_openzeppelin() -> None:
    node = shutil.which("node")
    assert node is not None, "node is installed by `make install` (npm ci)"
    sizes = [*range(1, 18), 31, 32, 33, 128, 256]
    batches = [leaves(n, seed=n) for n in sizes]
    # units as decimal strings: uint256 values above 2**53 must not pass through a JS number
    payload = json.dumps([[["0x" + k.hex(), str(u)] for k, u in b] for b in batches])
    done = subprocess.run([node, "-e", SCRIPT], input=payload, capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=True)  # fmt: skip
    theirs = json.loads(done.stdout)
    for batch, want in zip(batches, theirs, strict=True):
        tree = BatchTree.of(batch)
        assert "0x" + tree.root.hex() == want["root"], len(batch)
        for i in range(len(batch)):
            assert ["0x" + h.hex() for h in tree.proof(i)] == want["proofs"][i], (len(batch), i)


def test_a_proof_holds_for_its_leaf_only() -> None:
    batch = leaves(13, seed=3)
    tree = BatchTree.of(batch)
    for i, (key, units) in enumerate(batch):
        assert verify(tree.root, key, units, tree.proof(i))
        assert not verify(tree.root, key, units + 1, tree.proof(i))  # other units: no
        other = batch[(i + 1) % len(batch)][0]
        assert not verify(tree.root, other, units, tree.proof(i))  # other key: no
    # the layout: leaf i sits at len - 1 - i
    assert [leaf_hash(*leaf) for leaf in batch] == list(reversed(tree.tree[-len(batch):]))
    with pytest.raises(IndexError):
        tree.proof(13)
    with pytest.raises(ValueError):
        BatchTree.of([])
    with pytest.raises(ValueError):
        leaf_hash(b"short", 1)
