"""`intellect devnet up --hosts`: every process on a host of its own (a network namespace), two
workers behind a NAT home router that nobody can call. They join the pool like the reachable one
(their invites fetched at discovery), a 20 s cut between one of them and the orchestrator ejects
no one, and `devnet down` removes the whole world, also after `up` itself was killed with -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devnet.hosts import namespaces
from devnet.losses import Books, Worker
from ledger.client import LedgerClient

pytestmark = pytest.mark.slow
# the bound docs/devnet-hosts.md states: a node cut from the orchestrator for 20 s is Healthy again
# within this long of the heal (its next heartbeat, then the next liveness check)
BACK_WITHIN = 60
INTELLECT = [str(Path(sys.executable).parent / "intellect")]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INTELLECT, *args], capture_output=True, text=True, timeout=timeout)


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True).stdout


def netns_of(pid: int) -> str:
    return ip("netns", "identify", str(pid)).strip()


def wait_until(what: str, predicate, timeout: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def test_hosts_devnet_nat_workers_join_and_a_short_cut_ejects_no_one(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    up = run("devnet", "up", "--hosts", "--workers", "3", "--dir", str(directory), "--json")
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        hosts = info["hosts"]
        assert {"chain", "redis", "discovery", "orch", "w1", "w2", "w3"} <= set(hosts)
        assert hosts["w1"]["home"] is None and hosts["w2"]["home"] == hosts["w3"]["home"] == "home"
        # one namespace per process, none of them this machine's own
        spaces = {p["name"]: netns_of(p["pid"]) for p in info["processes"]}
        assert len(set(spaces.values())) == len(spaces) and "" not in spaces.values(), spaces
        assert info["rpc_url"].startswith(f"http://{hosts['chain']['address']}:")
        orch = next(p["url"] for p in info["processes"] if p["name"] == "orchestrator")
        token = Path(info["orchestrator_admin_token_file"]).read_text().strip()
        nodes = {f"w{i}": info["accounts"][f"node-{i}"] for i in (1, 2, 3)}

        def listing() -> dict[str, dict]:
            reply = httpx.get(f"{orch}/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=5)
            return {n["address"]: n for n in reply.json()["nodes"]}

        def all_healthy() -> bool:
            found = listing()
            return all(found.get(a, {}).get("state") == "Healthy" for a in nodes.values())

        wait_until("every worker Healthy", all_healthy, 120)
        found = listing()
        # the reachable worker was called; the NATed ones fetched their invites at discovery
        assert found[nodes["w1"]]["joined_via"] == "push"
        assert found[nodes["w2"]]["joined_via"] == found[nodes["w3"]]["joined_via"] == "pull"
        chain = LedgerClient(info["rpc_url"], Path(info["deployment"]))
        assert set(chain.pool_nodes(info["pool_id"])) == set(nodes.values())

        # a 20 s cut between a NATed worker and the orchestrator: no one ejected, back when healed
        cut = run("devnet", "partition", "w2", "orch", "--dir", str(directory))
        assert cut.returncode == 0 and "cut the link w2" in cut.stdout, cut.stderr
        seen = set()
        started = time.monotonic()
        while time.monotonic() - started < 20:
            seen.add(listing()[nodes["w2"]]["state"])
            time.sleep(1)
        healed = run("devnet", "heal", "w2", "orch", "--dir", str(directory))
        assert healed.returncode == 0, healed.stderr
        assert "Ejected" not in seen and seen - {"Healthy"}, seen  # it was missed, and kept
        back = time.monotonic()
        wait_until("w2 Healthy after the heal", all_healthy, 60)
        print(f"w2 during a 20 s cut: {sorted(seen)}; Healthy {time.monotonic() - back:.1f}s after the heal")
        assert set(chain.pool_nodes(info["pool_id"])) == set(nodes.values())
        bad = run("devnet", "partition", "w2", "nowhere", "--dir", str(directory))
        assert bad.returncode == 1 and "no host 'nowhere'" in bad.stderr
        # a restart on a host: its port is probed in its namespace, where its address exists
        restarted = run("devnet", "restart", "storage", "orchestrator", "--dir", str(directory), "--json")
        assert restarted.returncode == 0, restarted.stderr
        wait_until("every worker Healthy after the restarts", all_healthy, 120)
    finally:
        down = run("devnet", "down", "--dir", str(directory), "--purge")
    assert down.returncode == 0, down.stderr
    world = info["hosts"]["w1"]["netns"].split("-")[0]  # ix<N>
    assert not [n for n in namespaces() if n.startswith(f"{world}-")]


def test_down_removes_the_world_of_an_up_killed_with_9(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    before = set(namespaces())
    argv = [*INTELLECT, "devnet", "up", "--hosts", "--workers", "2", "--dir", str(directory)]
    up = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = directory / "world.json"
    # killed once the world exists and the chain and Redis run in it: mid-way, as a user's ^\\ would
    started = lambda: marker.exists() and (directory / "redis.log").exists()  # noqa: E731
    wait_until("the world and its first services", started, 120)
    index = json.loads(marker.read_text())["index"]
    os.kill(up.pid, signal.SIGKILL)
    up.wait()
    made = [n for n in namespaces() if n.startswith(f"ix{index}-")]
    assert made and f"ix{index}-chain" in made
    left = [int(p) for n in made for p in ip("netns", "pids", n).split()]
    assert left, "nothing ran in the world before the kill: the test would prove nothing"
    down = run("devnet", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert not [n for n in namespaces() if n.startswith(f"ix{index}-")]
    assert set(namespaces()) <= before
    for pid in left:
        wait_until(f"pid {pid} gone", lambda pid=pid: not Path(f"/proc/{pid}").exists()
                   or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", 10)  # fmt: skip
    assert f"ix{index}r" not in ip("-o", "link")


def test_demo_across_hosts_with_nat_workers_and_two_partitions(tmp_path: Path) -> None:
    """The whole RL run with every process on its own host, the honest w2 and the cheating w3 behind
    NAT, and two 20 s cuts while it trains (w2 ↔ orchestrator, validator-2 ↔ chain): the cheater and
    only the cheater is slashed, no honest file is voted invalid, every honest node is in the pool at
    the end and earned, the trainer reaches its last step."""
    directory = tmp_path / "demo"
    steps = 8
    argv = [*INTELLECT, "devnet", "up", "--demo", "--hosts", "--dir", str(directory), "--workers", "3",
            "--validators", "2", "--quorum", "2", "--steps", str(steps), "--timeout", "1200",
            "--json"]  # fmt: skip
    cuts: list[tuple[str, str, set[str]]] = []
    try:
        with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
            demo = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
            # once the trainer has published a checkpoint, cut one link at a time for 20 s
            wait_until("the first trainer step", lambda: (directory / "trainer" / "step_1.json").exists()
                       or demo.poll() is not None, 600)  # fmt: skip
            state = json.loads((directory / "devnet.json").read_text())
            orch = next(p["url"] for p in state["processes"] if p["name"] == "orchestrator")
            token = (directory / "orchestrator" / "admin-token").read_text().strip()
            w2 = next(a["address"] for a in state["accounts"] if a["role"] == "node-2")

            def w2_state() -> str:
                reply = httpx.get(f"{orch}/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=5)
                return next((n["state"] for n in reply.json()["nodes"] if n["address"] == w2), "?")

            for a, b in (("w2", "orch"), ("v2", "chain")):
                if demo.poll() is not None:
                    break
                assert run("devnet", "partition", a, b, "--dir", str(directory)).returncode == 0
                states = set()
                until = time.monotonic() + 20
                while time.monotonic() < until:
                    states.add(w2_state())
                    time.sleep(1)
                assert run("devnet", "heal", a, b, "--dir", str(directory)).returncode == 0
                healed = time.monotonic()
                wait_until(f"w2 Healthy after the {a}-{b} heal", lambda: w2_state() == "Healthy"
                           or demo.poll() is not None, BACK_WITHIN)  # fmt: skip
                cuts.append((a, b, states | {f"Healthy after {time.monotonic() - healed:.0f} s"}))
            returncode = demo.wait(timeout=1500)
            ended = time.time()
        stderr = (tmp_path / "err").read_text()[-3000:]
        out_text = (tmp_path / "out").read_text()
        assert out_text.strip(), stderr
        report = json.loads(out_text)
        # the protocol's promise first, with its reasons
        assert report["honest_invalidations"] == [], report["honest_invalidations"]
        assert report["honest_out_of_pool"] == {}, report["honest_out_of_pool"]
        assert returncode == 0, stderr
        assert len(cuts) == 2, "the run ended before both links were cut: the test would prove less"
        assert all("Ejected" not in states for _, _, states in cuts), cuts
        assert report["steps"] >= steps and report["cheater_ejected"]
        devnet = json.loads((directory / "devnet.json").read_text())
        accounts = {a["role"]: a["address"] for a in devnet["accounts"]}
        honest = [accounts["node-1"], accounts["node-2"]]
        assert all(report["claimable"][n] + report["pending"][n] > 0 for n in honest), report["claimable"]
        chain = LedgerClient(devnet["rpc_url"], Path(devnet["deployment_path"]))
        assert all(chain.is_node_in_pool(devnet["pool_id"], n) for n in honest)
        assert not chain.is_node_in_pool(devnet["pool_id"], accounts["node-3"])
        # nothing lost, nothing counted twice: every file the honest workers made while the trainer still
        # trained is on chain and judged by both validators, once each (the devnet is still up: its
        # uploaders and validators drain). Files made in the last 30 s before its last step or after are
        # left out: the demo deletes the task as the trainer finishes, and the orchestrator refuses
        # uploads for a task the node is no longer assigned (an end-of-run loss, not a partition's).
        validators = {p["name"]: p["url"] for p in devnet["processes"] if p["name"].startswith("validator")}
        workers = [Worker(f"w{i}", accounts[f"node-{i}"], directory / f"worker-{i}") for i in (1, 2)]
        books = Books(chain, devnet["pool_id"], workers, validators, accounts["node-3"])
        trained = max(p.stat().st_mtime for p in (directory / "trainer").glob("step_*.json"))
        found, counts = books.findings(cutoff=min(trained, ended) - 30, drain=240)
        # a lone soft vote takes nothing; a file that reached the validators too late to train on (w2's,
        # after its cut) is not paid by policy and never slashed
        assert [f for f in found if f.kind not in ("soft_vote", "stale")] == [], found
        assert counts["honest_files_made"] > 0 and counts["honest_files_on_chain"] > 0, counts
        print(f"cuts: {cuts}; {report['files_judged']} files judged in {report['wall_seconds']:.0f} s; "
              f"{counts}")
    finally:
        down = run("devnet", "down", "--dir", str(directory), "--purge")
    assert down.returncode == 0, down.stderr
