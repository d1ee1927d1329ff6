"""Private keys by reference: `file:/path/to/key` instead of the key itself.

A key in a process's environment can be read by anything that can read `/proc/<pid>/environ`
(and is inherited by every child), so services accept, wherever a raw key setting exists
(`INTELLECT_WORKER_NODE_KEY`, `INTELLECT_ORCH_MANAGER_KEY`, `INTELLECT_VALIDATOR_KEY`,
`INTELLECT_PRIVATE_KEY`), the value `file:PATH`: the key is read from PATH at start-up and only the
path sits in the environment. The file must be a regular file readable by its owner alone (mode
0600 or 0400): a key file others can read is refused, naming the `chmod` that fixes it.
`write_key_file` is the writer devnets use.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, SecretStr

PREFIX = "file:"
MAX_KEY_FILE_BYTES = 1024


class KeyFileError(ValueError):
    """A `file:` key reference that cannot be used; the message names the file and the fix."""


def read_key_file(path: Path) -> str:
    """The key text of `path` (stripped), after checking it is private to its owner."""
    try:
        info = path.stat()
    except OSError as exc:
        raise KeyFileError(f"key file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"key file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise KeyFileError(
            f"key file {path} can be read by other users (mode {stat.S_IMODE(info.st_mode):o}): "
            f"run `chmod 600 {path}`"
        )
    if info.st_size > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {path} is {info.st_size} bytes: a private key file holds one key")
    text = path.read_text().strip()
    if not text:
        raise KeyFileError(f"key file {path} is empty")
    return text


def resolve_key(value: object) -> object:
    """`file:PATH` → the key in PATH; any other value unchanged (pydantic validates it next)."""
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    if isinstance(raw, str) and raw.startswith(PREFIX):
        return read_key_file(Path(raw[len(PREFIX):]).expanduser())
    return value


# A settings field holding a private key, given raw or as `file:PATH`.
KeySecret = Annotated[SecretStr, BeforeValidator(resolve_key)]


def write_key_file(path: Path, key: str) -> str:
    """Write `key` to `path` as 0600 (its folder 0700) and return the `file:` reference to it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    os.replace(tmp, path)
    return PREFIX + str(path.absolute())
