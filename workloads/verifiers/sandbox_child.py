"""Runs inside fresh mount, network and PID namespaces (via `unshare`), as root of those namespaces:
hides the host's world-writable directories behind private tmpfs mounts, drops to `nobody`, applies
resource limits and execs the untrusted program. Standard library only: it runs with `python -I`.

argv: program_path python_executable limits_json
"""

import ctypes
import json
import os
import resource
import sys

NOBODY = 65534


def private_tmpfs(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if os.path.isdir(path) and libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, b"size=16m,mode=1777") != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")


def main() -> None:
    program_path, python, limits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    with open(program_path, "rb") as f:
        source = f.read()
    # Every world-writable place becomes a private, throw-away tmpfs; the rest of the tree is owned
    # by root and not writable by `nobody`.
    for path in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        private_tmpfs(path)
    os.makedirs("/tmp/work", mode=0o777)
    os.chmod("/tmp/work", 0o777)
    with open("/tmp/work/main.py", "wb") as f:
        f.write(source)
    os.chdir("/tmp/work")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/work", "LANG": "C.UTF-8"}
    os.execve(python, [python, "-I", "-S", "main.py"], env)


if __name__ == "__main__":
    main()
