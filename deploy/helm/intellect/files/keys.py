"""The chart's "keys" init container: secrets from /run/secrets-in into /run/keys as 0400 files.

Kubernetes mounts a Secret group-readable (0440) for a non-root pod, and the Intellect services
refuse a key file that others can read (intellect/keyfiles.py). Each argument is KIND:SOURCES:DEST:
  copy:SRC:DEST                 the file as it is
  pgpass:SRC:DEST               libpq's password file (PGPASSFILE) for any host, database and user
  aws:ID_SRC,SECRET_SRC:DEST    boto's shared credentials file (AWS_SHARED_CREDENTIALS_FILE)
  seaweedfs:ID_SRC,SECRET_SRC:DEST  SeaweedFS's S3 identities (the trial S3 server)
Standard library only: it runs in the service image before the service starts. It never prints a
secret, only the files it wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def pgpass_field(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def render(kind: str, sources: list[str]) -> str:
    values = [read(s) for s in sources]
    if kind == "copy":
        return values[0] + "\n"
    if kind == "pgpass":
        return f"*:*:*:*:{pgpass_field(values[0])}\n"
    if kind == "aws":
        return f"[default]\naws_access_key_id = {values[0]}\naws_secret_access_key = {values[1]}\n"
    if kind == "seaweedfs":
        identity = {"name": "intellect", "credentials": [{"accessKey": values[0], "secretKey": values[1]}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        return json.dumps({"identities": [identity]}) + "\n"
    raise SystemExit(f"keys: unknown kind {kind!r} (copy, pgpass, aws, seaweedfs)")


def write_private(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):  # a restarted init container finds its 0400 file
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def main(specs: list[str]) -> int:
    for spec in specs:
        kind, sources, dest = spec.split(":", 2)
        os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        write_private(dest, render(kind, sources.split(",")))
        print(f"keys: wrote {dest} ({kind}, mode 0400)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
