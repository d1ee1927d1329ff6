"""Runs one task command confined, as a container would, for the process runtime (root workers).

    python -I -S confine.py SPEC_JSON -- CMD...

Run by the task's supervisor as root; the task itself never runs as root:
- new mount and PID namespaces: the task sees only its own processes (a fresh /proc), never the
  worker's or any service's, so `/proc/<pid>/environ` and `cmdline` of a process holding a key are
  out of its reach;
- a new root on a small tmpfs holding only what the task needs: the system folders (/usr, /etc, ...),
  the Python installation and the project, read-only; its own data dir, the shared dir, its mounts
  and the bridge socket's folder, writable; a private /tmp and /dev/shm (memory, capped).
  Nothing else of the host is there: no worker state dir, no key file, no devnet directory outside
  the paths listed;
- an unprivileged uid/gid (`nobody` by default) with no supplementary groups and no_new_privs.

The network is the host's (tasks reach the orchestrator, storage and peers as in a container with
host networking). Layout: the outer process forwards signals to the namespace's init (this script
again, PID 1 there), which forwards them to the task, reaps orphans and exits with the task's code;
when it exits the kernel kills whatever is left in the namespace. Standard library only.

SPEC_JSON: {"uid", "gid", "root", "read_only": [...], "writable": [...], "cwd", "tmp_bytes", "shm_bytes"}
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import warnings  # noqa: F401 - os.execvp imports it lazily, and the task's root may lack it

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
LIBC = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    check(LIBC.mount(encode(source), encode(target), encode(fstype), flags, encode(data)),
          f"mount {source or fstype} on {target}")


def place(path: str, root: str, writable: bool) -> None:
    """Show host `path` at the same path under `root` (a symlink stays a symlink)."""
    target = root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    mount(path, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if path.startswith("/dev/") else MS_NODEV)
    mount(None, target, None, flags | (0 if writable else MS_RDONLY))


def build_root(spec: dict) -> None:
    root = spec["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    # A private /tmp first: the paths placed next may themselves lie under the host's /tmp.
    os.makedirs(root + "/tmp")
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_bytes']},mode=1777")
    for path in spec["read_only"]:
        if os.path.lexists(path):
            place(path, root, writable=False)
    for path in spec["writable"]:
        place(path, root, writable=True)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/dev/shm", exist_ok=True)
    for name in DEVICES + tuple(n for n in os.listdir("/dev") if n.startswith("nvidia")):
        if os.path.exists("/dev/" + name):
            place("/dev/" + name, root, writable=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['shm_bytes']},mode=1777")
    os.chroot(root)
    os.chdir(spec["cwd"])


def forward_to(pid: int) -> None:
    def handler(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, handler)


def exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def run_task(spec: dict, argv: list[str]) -> None:
    """In the child: drop to the task's user for good and become the task."""
    try:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
        check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"confine: cannot start {argv[0]!r}: {exc.strerror or exc}\n")
        sys.stderr.flush()
    finally:
        os._exit(127)


def namespace_init(spec: dict, argv: list[str]) -> None:
    """PID 1 of the task's namespace: build the root, start the task, reap, exit with its code."""
    check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    try:
        build_root(spec)
    except OSError as exc:
        sys.stderr.write(f"confine: cannot build the task's root: {exc}\n")
        sys.stderr.flush()
        os._exit(126)
    task = os.fork()
    if task == 0:
        run_task(spec, argv)
    forward_to(task)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == task:
            os._exit(exit_code(status))


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: confine.py SPEC_JSON -- CMD...\n")
        return 2
    spec, argv = json.loads(args[0]), args[2:]
    check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare (the process runtime confines tasks as root)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    init = os.fork()
    if init == 0:
        namespace_init(spec, argv)
    forward_to(init)
    while True:
        try:
            _, status = os.waitpid(init, 0)
            return exit_code(status)
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
