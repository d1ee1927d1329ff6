"""Scale-out storage: any S3-compatible store through presigned URLs (boto3).

The presigned PUT carries the expected SHA-256 (`x-amz-checksum-sha256`) and length, so the store
itself refuses a body that differs; single use is enforced by the orchestrator's upload records.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from intellect.wire.storage import UploadGrant
from orchestrator.storage.base import ObjectInfo, object_key


class S3Storage:
    def __init__(
        self, bucket: str, endpoint_url: str | None = None, region: str | None = None, prefix: str = ""
    ) -> None:
        import boto3  # imported here: only scale-out deployments need it
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        # SigV4 signs the checksum and length headers into the URL; SigV2 (boto's fallback without a
        # region) would leave them unsigned, so a worker could PUT any body under the grant.
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region,
                                   config=Config(signature_version="s3v4"))

    def _key(self, key: str) -> str:
        key = object_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _ttl(self, expires_at: datetime) -> int:
        return max(1, int((expires_at - datetime.now(UTC)).total_seconds()))

    def grant_put(
        self, key: str, upload_id: str, size: int, sha256: str, expires_at: datetime
    ) -> UploadGrant:
        checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
        url = self.client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": self._key(key),
                "ContentLength": size,
                "ChecksumSHA256": checksum,
                "ChecksumAlgorithm": "SHA256",  # signed too, so the store keeps the checksum for stat
            },
            ExpiresIn=self._ttl(expires_at),
        )
        return UploadGrant(
            upload_id=upload_id,
            file_name=object_key(key),
            url=url,
            expires_at=expires_at,
            headers={"x-amz-checksum-sha256": checksum, "x-amz-sdk-checksum-algorithm": "SHA256",
                     "Content-Length": str(size)},
        )

    def grant_get(self, key: str, expires_at: datetime) -> str:
        return self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._key(key)},
            ExpiresIn=self._ttl(expires_at),
        )

    def stat(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        except ClientError:
            return None
        checksum = head.get("ChecksumSHA256")
        sha = base64.b64decode(checksum).hex() if checksum else ""
        return ObjectInfo(key=object_key(key), size=int(head["ContentLength"]), sha256=sha)
