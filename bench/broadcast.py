"""Checkpoint broadcast throughput on loopback, side by side with a plain HTTP stream and shardcast.

.venv/bin/python bench/broadcast.py                      # 512 MB file, table
.venv/bin/python bench/broadcast.py --size-mb 128 --json
flock /tmp/bench.lock .venv/bin/python bench/broadcast.py --runs 3 --repeat 1   # 3 whole runs, each printed

Every server and every client is its own process (clients are measured with wait4: wall time and
peak RSS). Figures: raw = one HTTP stream of the file to disk (uvicorn FileResponse with the same
1 MiB chunks as ours → httpx → file, and → http.client readinto → file; no hashing; the ratio is
against the faster of the two); ours origin → 1 client; ours end to end through a
relay (publish done → client holds the verified file, the relay fetching while it serves); 4
clients at once from a warm relay; shardcast 0.3.2 origin → client and through its middle node
(publish done → middle complete → client done: it cannot serve before it has a whole shard set).
Temp data lives under /tmp/bench-broadcast-* and is removed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib  # noqa: E402

import httpx  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from intellect.net import free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-c", "from workloads.broadcast.cli import main; main()", "--log-level", "warning"]
SC_BIN = Path(PY).parent
app = typer.Typer(add_completion=False)

RAW_SERVER = """
import sys, uvicorn
from fastapi import FastAPI
from workloads.broadcast.api import ShardResponse
app = FastAPI()
@app.get("/file")
def file():
    return ShardResponse(sys.argv[1], media_type="application/octet-stream")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""

RAW_CLIENT = """
import json, sys, time, httpx
start = time.monotonic()
with httpx.stream("GET", sys.argv[1], timeout=60) as resp, open(sys.argv[2], "wb") as out:
    resp.raise_for_status()
    for chunk in resp.iter_raw():
        out.write(chunk)
print(json.dumps({"seconds": time.monotonic() - start}))
"""

RAW_READINTO = """
import http.client, json, sys, time
from urllib.parse import urlsplit
start = time.monotonic()
url = urlsplit(sys.argv[1])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
conn.request("GET", url.path)
resp = conn.getresponse()
assert resp.status == 200, resp.status
view = memoryview(bytearray(1 << 20))
with open(sys.argv[2], "wb") as out:
    while n := resp.readinto(view):
        out.write(view[:n])
print(json.dumps({"seconds": time.monotonic() - start}))
"""

SC_ORIGIN = """
import sys, time
from pathlib import Path
from shardcast.origin_server import OriginServer
data, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
trigger, done = Path(sys.argv[4]), Path(sys.argv[5])
Path(data).mkdir(parents=True, exist_ok=True)
(Path(data) / "data1.bin").write_bytes(b"\\0" * (1 << 20))  # the probe its clients fetch first
node = OriginServer(data, port)
while not trigger.exists():
    time.sleep(0.02)
node.broadcast(src)
done.write_text(str(time.time()))
while True:
    time.sleep(1)
"""


class Procs:
    """Servers started by the bench, killed (by pid) at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout}s")


@dataclass(order=True)
class Run:
    """One measured client run (or several at once): wall seconds including interpreter start-up,
    in-process transfer seconds when the client reports them (`--json`), peak RSS of the largest."""

    wall: float
    inner: float
    rss_mb: float


def measured(args_list: list[list[str]], work: Path, settle: bool = True) -> Run:
    """Run these client processes at once under /usr/bin/time (its tiny RSS is what a child inherits
    at fork, unlike this process's). `settle` first flushes dirty pages (os.sync): otherwise a run
    right after others that wrote GBs is throttled by their writeback and measures the disk."""
    if settle:
        os.sync()
    start = time.monotonic()
    procs = []
    for i, args in enumerate(args_list):
        rss_file = work / f"rss-{i}.txt"
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *args]
        procs.append(
            (subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE), rss_file)
        )
    peak, inner = 0.0, 0.0
    for proc, rss_file in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(str(a) for a in proc.args[-8:])} failed: {err.decode()[-800:]}")  # type: ignore[index]
        peak = max(peak, int(rss_file.read_text().split()[-1]) / 1024)
        with contextlib.suppress(ValueError, IndexError, KeyError):
            inner = max(inner, float(json.loads(out.decode().strip().splitlines()[-1])["seconds"]))
    wall = time.monotonic() - start
    return Run(wall, inner or wall, peak)


def same_file(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 22), fb.read(1 << 22)
            if x != y:
                return False
            if not x:
                return True


def make_file(path: Path, size: int) -> None:
    with open(path, "wb") as out:
        left = size
        while left:
            block = os.urandom(min(1 << 24, left))
            out.write(block)
            left -= len(block)


def bench_raw(work: Path, src: Path, procs: Procs, repeat: int) -> dict[str, list[Run]]:
    """The plain stream, two ways: httpx chunks → file.write, and http.client readinto a 1 MiB buffer
    → file.write (the faster here; the ratio uses the faster of the two). Every run is returned."""
    port = free_port()
    procs.start([PY, "-c", RAW_SERVER, str(src), str(port)])
    wait_http(f"http://127.0.0.1:{port}/docs")
    runs: dict[str, list[Run]] = {"httpx": [], "readinto": []}
    for i in range(repeat):  # the two clients alternate, so a burst of load hits both alike
        for name, code in (("httpx", RAW_CLIENT), ("readinto", RAW_READINTO)):
            out = work / f"raw-{i}.bin"
            runs[name].append(measured([[PY, "-c", code, f"http://127.0.0.1:{port}/file", str(out)]], work))
            assert same_file(src, out), "raw copy differs"
            out.unlink()
    return runs


def bench_ours(
    work: Path, src: Path, procs: Procs, repeat: int, clients: int, shard_size: int
) -> dict[str, Any]:
    env = {"INTELLECT_BROADCAST_POLL_SECONDS": "0.2", "INTELLECT_BROADCAST_SHARD_SIZE": str(shard_size)}
    o_port, r_port = free_port(), free_port()
    origin, relay = f"http://127.0.0.1:{o_port}", f"http://127.0.0.1:{r_port}"
    procs.start([*CLI, "origin", "--dir", str(work / "o"), "--port", str(o_port), "--host", "127.0.0.1"], env)
    wait_http(f"{origin}/health")
    procs.start([*CLI, "relay", "--upstream", origin, "--dir", str(work / "r"), "--port", str(r_port),
                 "--host", "127.0.0.1"], env)  # fmt: skip
    wait_http(f"{relay}/health")

    def fetch(version: int, url: str, out: Path) -> list[str]:
        return [
            *CLI,
            "fetch",
            "--version",
            str(version),
            "--out",
            str(out),
            "--relay",
            url,
            "--wait",
            "60",
            "--json",
        ]

    runs: dict[str, list[Run]] = {"direct": [], "e2e": [], "warm": []}
    publish_s = 0.0
    for i in range(repeat):
        version = i + 1
        os.sync()
        t = time.monotonic()
        subprocess.run([*CLI, "publish", str(src), "--version", str(version), "--dir", str(work / "o"),
                        "--shard-size", str(shard_size)], check=True, cwd=REPO, env={**os.environ, **env},
                       stdout=subprocess.DEVNULL)  # fmt: skip
        publish_s = time.monotonic() - t
        # End to end: the client starts the moment publish returns; origin and relay each notice the
        # version within a poll (0.2 s), the relay serves shards while it still fetches the rest.
        runs["e2e"].append(measured([fetch(version, relay, work / "e2e.bin")], work, settle=False))
        runs["direct"].append(measured([fetch(version, origin, work / "direct.bin")], work))
        runs["warm"].append(measured([fetch(version, relay, work / "warm.bin")], work))
        for name in ("e2e.bin", "direct.bin", "warm.bin"):
            assert same_file(src, work / name), f"{name} differs"
            (work / name).unlink()
    many = measured([fetch(repeat, relay, work / f"many-{c}.bin") for c in range(clients)], work)
    for c in range(clients):
        assert same_file(src, work / f"many-{c}.bin")
        (work / f"many-{c}.bin").unlink()
    return {**runs, "many": [many], "publish_s": publish_s}


def bench_shardcast(work: Path, src: Path, procs: Procs) -> dict[str, Run]:
    o_port, m_port = free_port(), free_port()
    origin, middle = f"http://127.0.0.1:{o_port}", f"http://127.0.0.1:{m_port}"
    trigger, done = work / "sc-go", work / "sc-done"
    procs.start([PY, "-c", SC_ORIGIN, str(work / "sco"), str(o_port), str(src), str(trigger), str(done)])
    wait_http(f"{origin}/data1.bin")
    (work / "scm").mkdir()
    (work / "scm" / "data1.bin").write_bytes(b"\0" * (1 << 20))
    procs.start([str(SC_BIN / "shardcast-middle"), "--upstream", origin, "--data-dir", str(work / "scm"),
                 "--port", str(m_port), "--check-interval", "1", "--log-level", "WARNING"])  # fmt: skip
    wait_http(f"{middle}/data1.bin")
    os.sync()
    trigger.touch()
    while not done.exists():
        time.sleep(0.02)
    published = float(done.read_text())
    shards = (src.stat().st_size + 50_000_000 - 1) // 50_000_000
    folder = work / "scm" / "v1"

    def middle_complete() -> bool:
        names = {p.name for p in folder.glob("shard_*.bin")} if folder.exists() else set()
        return len(names) == shards and not list(folder.glob("*.tmp"))

    while not middle_complete():  # its middle node serves nothing of v1 before it is complete
        time.sleep(0.02)

    def client(url: str, out: Path) -> list[str]:
        return [str(SC_BIN / "shardcast-client"), "--servers", url, "--version", "v1",
                "--output-file", str(out), "--output-dir", str(work / f"scd-{out.stem}"),
                "--log-level", "WARNING"]  # fmt: skip

    via_middle = measured([client(middle, work / "sc-e2e.bin")], work, settle=False)
    e2e = time.time() - published
    assert same_file(src, work / "sc-e2e.bin")
    direct = measured([client(origin, work / "sc-direct.bin")], work)
    assert same_file(src, work / "sc-direct.bin")
    return {"e2e": Run(e2e, e2e, via_middle.rss_mb), "direct": direct}


def best_of(runs: list[Run], key: str = "inner") -> Run:
    """The run kept for a row: fastest transfer (or wall, for end-to-end rows)."""
    return min(runs, key=lambda r: r.wall if key == "wall" else r.inner)


def one_run(size_mb: int, clients: int, repeat: int, shard_size: int, skip_shardcast: bool) -> dict[str, Any]:
    """Every figure once, side by side (raw, ours, shardcast), on a fresh file and fresh servers:
    rows (what, kept run, clients, every run's MB/s) and the ratios of this run."""
    work = Path(tempfile.mkdtemp(prefix="bench-broadcast-", dir="/tmp"))
    procs = Procs()
    load_before = os.getloadavg()
    size = size_mb * 1_000_000
    try:
        src = work / "checkpoint.safetensors"
        make_file(src, size)
        raw_runs = bench_raw(work, src, procs, repeat)
        raws = {name: best_of(runs) for name, runs in raw_runs.items()}
        raw = min(raws.values(), key=lambda r: r.inner)
        raw_wall = min((r for runs in raw_runs.values() for r in runs), key=lambda r: r.wall)
        our_runs = bench_ours(work, src, procs, repeat, clients, shard_size)
        ours_publish_s = our_runs.pop("publish_s")
        ours = {k: best_of(v, "wall" if k == "e2e" else "inner") for k, v in our_runs.items()}
        sc = bench_shardcast(work, src, procs) if not skip_shardcast and shutil.which("wget") else None
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)

    def mbps(seconds: float, n: int = 1) -> float:
        return n * size / 1e6 / seconds

    # (what, best run, clients, every run's MB/s on the basis the best was chosen by)
    def spread(runs: list[Run], n: int = 1, key: str = "inner") -> list[float]:
        return [mbps(r.wall if key == "wall" else r.inner, n) for r in runs]

    rows: list[tuple[str, Run, int, list[float]]] = [
        ("raw HTTP stream → disk, httpx (1 stream, no hashing)", raws["httpx"], 1, spread(raw_runs["httpx"])),
        ("raw HTTP stream → disk, http.client readinto (no hashing)", raws["readinto"], 1,
         spread(raw_runs["readinto"])),
        ("ours origin → 1 client", ours["direct"], 1, spread(our_runs["direct"])),
        ("ours origin → relay → 1 client, end to end", ours["e2e"], 1, spread(our_runs["e2e"], key="wall")),
        ("ours warm relay → 1 client", ours["warm"], 1, spread(our_runs["warm"])),
        (f"ours warm relay → {clients} clients at once (aggregate)", ours["many"], clients,
         spread(our_runs["many"], clients)),
    ]  # fmt: skip
    if sc:
        rows += [("shardcast origin → 1 client", sc["direct"], 1, spread([sc["direct"]])),
                 ("shardcast origin → middle → 1 client, end to end", sc["e2e"], 1,
                  spread([sc["e2e"]], key="wall"))]  # fmt: skip
    ratios = {
        "ours_over_raw (transfer)": raw.inner / ours["direct"].inner,
        "ours_over_raw (process wall)": raw_wall.wall / ours["direct"].wall,
    }
    if sc:
        ratios["ours_over_shardcast (relay, end to end)"] = sc["e2e"].wall / ours["e2e"].wall
        ratios["ours_over_shardcast (relay, end to end, slowest of ours)"] = sc["e2e"].wall / max(
            r.wall for r in our_runs["e2e"]
        )
        ratios["ours_over_shardcast (origin → client, wall)"] = sc["direct"].wall / ours["direct"].wall
    return {"size": size, "rows": rows, "ratios": ratios, "publish_s": ours_publish_s,
            "load": (load_before, os.getloadavg())}  # fmt: skip


@app.command()
def main(
    size_mb: int = typer.Option(512, "--size-mb", min=1, help="checkpoint size in MB (10^6 bytes)"),
    clients: int = typer.Option(4, "--clients", min=1, help="clients at once from one relay"),
    repeat: int = typer.Option(2, "--repeat", min=1, help="runs per single-client figure; best is kept"),
    runs: int = typer.Option(1, "--runs", min=1, help="whole comparisons, each printed with its ratios"),
    shard_size: int = typer.Option(50_000_000, "--shard-size", min=1, help="our shard size (bytes)"),
    skip_shardcast: bool = typer.Option(False, "--skip-shardcast", help="do not run shardcast 0.3.2"),
    as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
) -> None:
    """`--runs N` repeats the whole comparison (fresh file, fresh servers, shardcast too) N times and
    prints every run's table and ratios, then one line per run: a goal "in every run" is read there,
    not from the best run."""
    results = []
    for number in range(1, runs + 1):
        result = one_run(size_mb, clients, repeat, shard_size, skip_shardcast)
        results.append(result)
        if not as_json:
            print_run(result, size_mb, f"run {number} of {runs}: " if runs > 1 else "")
    if as_json:
        every = [as_dict(r, size_mb) for r in results]
        print(json.dumps(every if runs > 1 else every[0]))
        return
    if runs > 1:
        summary = Table(title=f"every run, {size_mb} MB")
        names = list(results[0]["ratios"])
        for col in ("run", *names):
            summary.add_column(col, justify="right")
        for number, result in enumerate(results, 1):
            summary.add_row(str(number), *(f"{result['ratios'].get(n, float('nan')):.2f}" for n in names))
        Console(width=max(Console().width, 200)).print(summary)


def as_dict(result: dict[str, Any], size_mb: int) -> dict[str, Any]:
    size = result["size"]
    return {"size_mb": size_mb, "publish_s": result["publish_s"], "ratios": result["ratios"],
            "loadavg_before": result["load"][0], "loadavg_after": result["load"][1],
            "rows": [{"what": w, "wall_s": r.wall, "transfer_s": r.inner,
                      "mb_per_s_wall": n * size / 1e6 / r.wall, "mb_per_s_transfer": n * size / 1e6 / r.inner,
                      "peak_rss_mb": r.rss_mb, "every_run_mb_per_s": every}
                     for w, r, n, every in result["rows"]]}  # fmt: skip


def print_run(result: dict[str, Any], size_mb: int, label: str) -> None:
    size, (load_before, load_after) = result["size"], result["load"]

    def mbps(seconds: float, n: int = 1) -> float:
        return n * size / 1e6 / seconds

    table = Table(title=f"{label}checkpoint broadcast, {size_mb} MB, loopback, {os.cpu_count()} CPUs, load "
                        f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after")  # fmt: skip
    for col in ("transfer", "wall s", "MB/s wall", "transfer s", "MB/s transfer", "every run MB/s",
                "client peak RSS MB"):  # fmt: skip
        table.add_column(col, justify="left" if col == "transfer" else "right")
    for what, run, n, every in result["rows"]:
        table.add_row(what, f"{run.wall:.2f}", f"{mbps(run.wall, n):.0f}", f"{run.inner:.2f}",
                      f"{mbps(run.inner, n):.0f}", " / ".join(f"{x:.0f}" for x in every),
                      f"{run.rss_mb:.0f}")  # fmt: skip
    console = Console(width=max(Console().width, 200))
    console.print(table)
    console.print("wall: client process start to exit (end to end rows: publish done to client exit); "
                  "transfer: as timed inside the client, without interpreter start-up; every run: "
                  "transfer MB/s of each run (end to end rows: wall); the best is the row's. Ratios vs "
                  "raw: the faster raw client's transfer (or process wall) over ours origin → 1 "
                  "client.")  # fmt: skip
    console.print(f"publish (split + hash, one pass) {result['publish_s']:.2f}s; ratios: "
                  + ", ".join(f"{k} = {v:.2f}" for k, v in result["ratios"].items()))  # fmt: skip


if __name__ == "__main__":
    app()
