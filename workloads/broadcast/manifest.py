"""What a version is: one file cut into fixed-size shards, each with its own sha256 and blake3.

The manifest is the unit of trust: a relay or client that holds it can check every shard on its
own (per-shard blake3, or sha256 for manifests written before blake3 was added) and the assembled
file (whole-file sha256; blake3 too, because shardcast 0.3.2 names versions by blake3 in its
`distribution.txt`). Receivers check shards by blake3: on this machine it hashes at about 6 GB/s on
one core where sha256 manages 1.4 GB/s, and on a 2-core host the hash was what kept a verified
download below a plain one (bench/broadcast.py). Shard indices start at 1 and the shard
file names are `shard_{i:05d}.bin`, exactly shardcast's layout, so both can serve the same tree.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import blake3
from pydantic import BaseModel, Field, ValidationError, model_validator

from workloads.broadcast.errors import InvalidManifest

BLOCK = 1 << 20
"""Streaming block size (1 MiB): every read, hash update and write works on at most this much."""

DEFAULT_SHARD_SIZE = 50_000_000
"""shardcast's fixed shard size: with it our shard files coincide with shardcast's byte for byte."""

HEX64 = r"^[0-9a-f]{64}$"
SHARD_NAME = re.compile(r"^shard_(\d{5,})\.bin$")


def shard_name(index: int) -> str:
    """File name of shard `index` (1-based), the same as shardcast's."""
    return f"shard_{index:05d}.bin"


def parse_shard_name(name: str) -> int | None:
    """The 1-based index in `shard_00003.bin`, or None for any other name."""
    match = SHARD_NAME.match(name)
    return int(match.group(1)) if match else None


class ShardInfo(BaseModel):
    """One shard: where it sits in the file and what its bytes hash to."""

    index: int = Field(ge=1, description="1-based, as in shard_00001.bin")
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=HEX64)
    blake3: str | None = Field(default=None, pattern=HEX64, description="None in older manifests")

    def check(self) -> tuple[str, str]:
        """(algorithm, hex digest) a receiver verifies this shard with: the cheapest one present."""
        return ("blake3", self.blake3) if self.blake3 else ("sha256", self.sha256)


class VersionManifest(BaseModel):
    """A published version (== trainer step): the whole file's hashes and its shards in order."""

    version: int = Field(ge=1, description="trainer step")
    size: int = Field(ge=0, description="bytes of the whole file")
    sha256: str = Field(pattern=HEX64, description="of the whole file")
    blake3: str = Field(pattern=HEX64, description="of the whole file (shardcast's checksum)")
    shard_size: int = Field(ge=1)
    shards: list[ShardInfo]

    @model_validator(mode="after")
    def _consistent(self) -> VersionManifest:
        """Refuse manifests whose shards do not tile the file: a client writes each shard at its
        offset into a preallocated file, so gaps or overlaps would silently corrupt the result."""
        expected = shard_count(self.size, self.shard_size)
        if len(self.shards) != expected:
            raise ValueError(
                f"{len(self.shards)} shards for {self.size} bytes at {self.shard_size} per shard"
            )
        offset = 0
        for i, shard in enumerate(self.shards, start=1):
            want = min(self.shard_size, self.size - offset)
            if shard.index != i or shard.offset != offset or shard.size != want:
                raise ValueError(f"shard {i} is at {shard.offset}+{shard.size}, expected {offset}+{want}")
            offset += shard.size
        return self

    def shard(self, index: int) -> ShardInfo:
        return self.shards[index - 1]

    @classmethod
    def parse(cls, raw: str | bytes, source: str = "manifest") -> VersionManifest:
        """Validate JSON from disk or the network, naming the source in the error."""
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidManifest(f"{source} is not a valid version manifest: {exc}") from None


class Hasher(Protocol):
    """hashlib's and blake3's hash objects, as the transfer code uses them."""

    def update(self, data: bytes | memoryview, /) -> Any: ...
    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str) -> Hasher:
    """A fresh hash object for ShardInfo.check()'s algorithm."""
    return blake3.blake3() if algorithm == "blake3" else hashlib.sha256()


def shard_count(size: int, shard_size: int) -> int:
    return (size + shard_size - 1) // shard_size


ShardSink = Callable[[int], BinaryIO]
"""Opens the destination of shard `index` for writing (the caller closes it)."""


def scan_file(
    path: Path, version: int, shard_size: int = DEFAULT_SHARD_SIZE, sink: ShardSink | None = None
) -> VersionManifest:
    """Hash `path` block by block into a manifest, optionally copying each shard out through `sink`.

    One pass over the file computes everything (whole sha256, blake3, shard sha256s) so publishing a
    checkpoint reads it once; memory stays at one block whatever the file size."""
    whole, whole_b3 = hashlib.sha256(), blake3.blake3()
    shards: list[ShardInfo] = []
    size = path.stat().st_size
    offset = 0
    with open(path, "rb") as f:
        for index in range(1, shard_count(size, shard_size) + 1):
            want = min(shard_size, size - offset)
            digest, digest_b3 = hashlib.sha256(), blake3.blake3()
            out = sink(index) if sink else None
            try:
                left = want
                while left:
                    block = f.read(min(BLOCK, left))
                    if not block:
                        raise InvalidManifest(
                            f"{path} shrank while being read (at byte {offset + want - left})"
                        )
                    digest.update(block)
                    digest_b3.update(block)
                    whole.update(block)
                    whole_b3.update(block)
                    if out:
                        out.write(block)
                    left -= len(block)
            finally:
                if out:
                    out.close()
            shards.append(ShardInfo(index=index, offset=offset, size=want, sha256=digest.hexdigest(),
                                    blake3=digest_b3.hexdigest()))
            offset += want
    return VersionManifest(
        version=version, size=size, sha256=whole.hexdigest(), blake3=whole_b3.hexdigest(),
        shard_size=shard_size, shards=shards,
    )  # fmt: skip
