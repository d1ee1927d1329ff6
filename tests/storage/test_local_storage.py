"""The embedded storage backend over real HTTP: signed, expiring, single-use, hash-checked uploads."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from intellect.net import free_port, wait_for_port
from orchestrator.storage import LocalDiskStorage, StorageError, UrlSigner, object_key, storage_router


@pytest.fixture
def storage(tmp_path: Path):
    port = free_port()
    store = LocalDiskStorage(tmp_path / "store", f"http://127.0.0.1:{port}", UrlSigner(os.urandom(32)))
    app = FastAPI()
    app.include_router(storage_router(store))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port("127.0.0.1", port)
    yield store
    server.should_exit = True
    thread.join(timeout=10)


def grant(store: LocalDiskStorage, data: bytes, key: str = "group-1/0/rollouts.parquet", ttl: float = 60):
    expires = datetime.now(UTC) + timedelta(seconds=ttl)
    return store.grant_put(key, uuid.uuid4().hex, len(data), hashlib.sha256(data).hexdigest(), expires)


def leftovers(store: LocalDiskStorage) -> list[str]:
    return [p.name for p in (store.root / "incoming").iterdir()]


def test_upload_then_download(storage: LocalDiskStorage) -> None:
    data = os.urandom(300_000)
    g = grant(storage, data)
    put = httpx.put(g.url, content=data, headers=g.headers)
    assert put.status_code == 201, put.text
    info = storage.stat(g.file_name)
    assert info is not None and info.sha256 == hashlib.sha256(data).hexdigest() and info.size == len(data)
    url = storage.grant_get(g.file_name, datetime.now(UTC) + timedelta(seconds=30))
    got = httpx.get(url)
    assert got.status_code == 200 and got.content == data


def test_replayed_url_is_refused_and_file_kept(storage: LocalDiskStorage) -> None:
    data = b"first"
    g = grant(storage, data)
    assert httpx.put(g.url, content=data).status_code == 201
    replay = httpx.put(g.url, content=data)
    assert replay.status_code == 409 and "already" in replay.json()["detail"]
    assert storage.path(g.file_name).read_bytes() == data


def test_wrong_hash_leaves_nothing_and_url_stays_usable(storage: LocalDiskStorage) -> None:
    data = b"honest bytes"
    g = grant(storage, data)
    bad = httpx.put(g.url, content=b"forged bytes")
    assert bad.status_code == 400 and "sha256" in bad.json()["detail"]
    assert storage.stat(g.file_name) is None and leftovers(storage) == []
    assert httpx.put(g.url, content=data).status_code == 201


def test_larger_than_granted_is_refused(storage: LocalDiskStorage) -> None:
    g = grant(storage, b"x" * 10)
    too_big = httpx.put(g.url, content=b"x" * 11)
    assert too_big.status_code == 413 and "larger" in too_big.json()["detail"]
    assert storage.stat(g.file_name) is None and leftovers(storage) == []


def test_expired_and_tampered_urls(storage: LocalDiskStorage) -> None:
    data = b"late"
    expired = grant(storage, data, ttl=-1)
    reply = httpx.put(expired.url, content=data)
    assert reply.status_code == 403 and "expired" in reply.json()["detail"]
    g = grant(storage, data)
    tampered = g.url.replace("rollouts.parquet", "other.parquet")
    reply = httpx.put(tampered, content=data)
    assert reply.status_code == 403 and "does not match" in reply.json()["detail"]
    assert storage.stat("group-1/0/other.parquet") is None


def test_download_needs_a_valid_signature(storage: LocalDiskStorage) -> None:
    data = b"private"
    g = grant(storage, data)
    httpx.put(g.url, content=data)
    url = storage.grant_get(g.file_name, datetime.now(UTC) + timedelta(seconds=30))
    assert httpx.get(url.replace("sig=", "sig=0")).status_code == 403


@pytest.mark.parametrize("name", ["../escape", "/abs/path", "a/../../b", "a//b", "a/./b", "x\x00y"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(StorageError):
        object_key(name)
