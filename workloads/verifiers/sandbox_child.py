"""Runs inside fresh mount, network and PID namespaces (via `unshare`), as root of those namespaces:
builds an empty root on a tmpfs holding only the interpreter and its libraries (read-only bind
mounts) and a writable /tmp/work, chroots into it, drops to an unprivileged user id of its own (a
random one from a range no account uses, not `nobody`), applies the resource limits and execs the
untrusted program. No host file but those binds exists for the program; unprivileged it cannot chroot
back out. A user id of its own because RLIMIT_NPROC counts every process of the user machine-wide:
as `nobody` the limit also counted the tasks a worker runs as `nobody` (and anything else that does),
and with a busy neighbour the program's first fork failed: a right answer scored as wrong. Standard
library only: it runs with `python -I`.

argv: program_path root_dir python_executable binds_json limits_json
"""

import ctypes
import json
import os
import random
import resource
import sys

# User ids no account has: 2^31 - 2^24 ... 2^31 - 2 (above every range useradd or systemd hands out).
SANDBOX_UIDS = range(2**31 - 2**24, 2**31 - 1)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source, target, fstype, flags, data=None):
    if _libc.mount(source.encode() if source else None, target.encode(),
                   fstype.encode() if fstype else None, flags, data.encode() if data else None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source} on {target}")


def bind_read_only(source, root):
    """`source` appears at the same path under `root`, read-only (no setuid, no devices)."""
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def main():
    program_path, root, python = sys.argv[1], sys.argv[2], sys.argv[3]
    binds, limits = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    with open(program_path, "rb") as f:
        source = f.read()
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=755")
    for path in binds:
        bind_read_only(path, root)
    work = root + "/tmp/work"
    os.makedirs(work)
    os.chmod(root + "/tmp", 0o1777)
    os.chmod(work, 0o777)
    with open(work + "/main.py", "wb") as f:
        f.write(source)
    os.chroot(root)
    os.chdir("/tmp/work")
    own = random.SystemRandom().choice(SANDBOX_UIDS)
    os.setgroups([])
    os.setgid(own)
    os.setuid(own)
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    env = {"PATH": os.path.dirname(python), "HOME": "/tmp/work", "LANG": "C.UTF-8"}
    os.execve(python, [python, "-I", "-S", "main.py"], env)


if __name__ == "__main__":
    main()
