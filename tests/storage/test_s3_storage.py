"""S3Storage against a real S3-compatible server (moto's standalone server on a loopback port).

The worker's side is plain HTTP: it PUTs to the presigned URL with the headers of the grant, and a
reader GETs the presigned download URL; nothing here talks to the storage class's boto3 client except
the orchestrator-side calls under test (grant_put, grant_get, stat).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import httpx
import pytest

from intellect.net import free_port
from orchestrator.storage.s3 import S3Storage

BUCKET = "intellect-uploads"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on port {port}") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def storage(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3Storage:
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return S3Storage(BUCKET, endpoint_url=s3_endpoint, region="us-east-1", prefix="pool-1")


def soon() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=5)


def test_presigned_upload_then_download(storage: S3Storage) -> None:
    body = b"rollouts " * 100
    sha = hashlib.sha256(body).hexdigest()
    grant = storage.grant_put("task-1/node-a/0.parquet", "u1", len(body), sha, soon())
    assert grant.file_name == "task-1/node-a/0.parquet"
    put = httpx.put(grant.url, content=body, headers=grant.headers)
    assert put.status_code == 200, put.text
    info = storage.stat("task-1/node-a/0.parquet")
    assert info is not None
    assert (info.size, info.sha256) == (len(body), sha)
    got = httpx.get(storage.grant_get("task-1/node-a/0.parquet", soon()))
    assert got.status_code == 200 and got.content == body
    listed = boto3.client("s3", endpoint_url=str(httpx.URL(grant.url).copy_with(path="/", query=None)),
                          region_name="us-east-1").list_objects_v2(Bucket=BUCKET)
    assert [item["Key"] for item in listed["Contents"]] == ["pool-1/task-1/node-a/0.parquet"]


def test_missing_object_has_no_stat(storage: S3Storage) -> None:
    assert storage.stat("task-1/node-a/never.parquet") is None


def test_grant_signs_length_and_checksum_into_the_url(storage: S3Storage) -> None:
    """SigV4 with the length and checksum among the signed headers: a real S3 refuses any other body.
    (moto does not check signatures, so the refusal itself is covered by the size check below.)"""
    grant = storage.grant_put("task-1/node-b/0.parquet", "u2", 64, "ab" * 32, soon())
    query = httpx.URL(grant.url).params
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert set(query["X-Amz-SignedHeaders"].split(";")) >= {
        "content-length", "x-amz-checksum-sha256", "x-amz-sdk-checksum-algorithm"}
    assert {"x-amz-checksum-sha256", "x-amz-sdk-checksum-algorithm", "Content-Length"} <= set(grant.headers)


def test_object_of_another_size_does_not_match_its_grant(storage: S3Storage) -> None:
    """Size limit: whatever a store lets through, `stat` reports it and the grant check refuses it, so
    the upload never completes (tests/uploads cover the completion path on local disk)."""
    granted = b"z" * 32
    bigger = b"z" * 4096
    sha = hashlib.sha256(granted).hexdigest()
    grant = storage.grant_put("task-1/node-c/0.parquet", "u3", len(granted), sha, soon())
    put = httpx.put(grant.url, content=bigger, headers={**grant.headers, "Content-Length": str(len(bigger))})
    info = storage.stat("task-1/node-c/0.parquet")
    if put.status_code >= 400:  # a store that enforces the signed length (real S3)
        assert info is None
    else:
        assert info is not None and info.size == len(bigger)
        assert not info.matches(len(granted), sha)


def test_exact_object_matches_its_grant(storage: S3Storage) -> None:
    body = b"exact" * 20
    sha = hashlib.sha256(body).hexdigest()
    grant = storage.grant_put("task-1/node-d/0.parquet", "u4", len(body), sha, soon())
    assert httpx.put(grant.url, content=body, headers=grant.headers).status_code == 200
    info = storage.stat("task-1/node-d/0.parquet")
    assert info is not None and info.matches(len(body), sha)
    assert not info.matches(len(body), "00" * 32)
