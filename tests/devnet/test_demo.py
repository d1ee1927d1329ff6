"""`intellect devnet up --demo` end to end, as a user runs it: chain, pool, discovery, orchestrator,
trainer, two validators with a 2-of-2 quorum on chain, three workers of which the last forges its
rewards. Without anyone acting, the RL task posted with the SDK runs: the trainer takes its steps
on validated rollouts only, the cheater is slashed and ejected by the quorum, honest nodes earn
rewards; a validator killed mid-run and restarted with `devnet restart` is followed by the demo (and
still votes); `devnet down` leaves no process behind, and a second `up --demo` in the same folder after
`down` is a new run as good as the first (issue 24; it was its own test, which ran the demo twice more:
now the first of its two runs is this one); that second run's workers generate with vLLM
(`--backend vllm`, issue 57: it replaced a test of its own that ran the same short demo) and every
honest file is paid. (The reward's rise over many steps is asserted in tests/trainer/test_rl_loop.py;
here the run is kept short.)"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from devnet.network import strays
from devnet.state import DevnetState
from ledger.client import LedgerClient
from ledger.events import EventReader
from ledger.models import ONE_TOKEN
from workloads.model.vllm_backend import VLLMMissing, vllm_python

INTELLECT = str(Path(sys.executable).parent / "intellect")
STEPS = 3


def backend_for_the_second_run() -> str:
    """vllm where its environment is (`make vllm`); torch elsewhere, but never under
    INTELLECT_REQUIRE_VLLM=1 (CI), where a missing environment fails the test."""
    try:
        vllm_python()
    except VLLMMissing as exc:
        if os.environ.get("INTELLECT_REQUIRE_VLLM") == "1":
            pytest.fail(f"INTELLECT_REQUIRE_VLLM=1 but {exc}")
        return "torch"
    return "vllm"


def crash_and_restart(
    directory: Path, name: str, demo: subprocess.Popen[str]
) -> subprocess.CompletedProcess[str]:
    """Once `name` has run for a while, kill it as a crash would and restart it with `devnet restart`,
    while the demo is still running."""
    deadline = time.monotonic() + 900
    seen_since = None
    while time.monotonic() < deadline and demo.poll() is None:
        state = DevnetState.load(directory) if (directory / "devnet.json").exists() else None
        proc = state.process(name) if state else None
        if proc is not None and proc.alive():
            seen_since = seen_since or time.monotonic()
            if time.monotonic() - seen_since > 15:
                restart = [INTELLECT, "devnet", "restart", name, "--kill", "--dir", str(directory)]
                return subprocess.run(restart, capture_output=True, text=True, timeout=300)
        time.sleep(1)
    raise AssertionError(f"{name} never ran for 15 s while the demo was running")


def test_demo_trains_slashes_the_cheater_and_cleans_up(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    argv = [INTELLECT, "devnet", "up", "--demo", "--dir", str(directory), "--workers", "3", "--validators",
            "2", "--quorum", "2", "--steps", str(STEPS), "--timeout", "1200", "--json"]  # fmt: skip
    try:
        with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
            demo = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
            # Issue 19.3: a restart is a normal event; the demo follows the new process.
            restarted = crash_and_restart(directory, "validator-2", demo)
            returncode = demo.wait(timeout=1500)
        stderr = (tmp_path / "err").read_text()[-3000:]
        state = DevnetState.load(directory)
        assert state is not None, stderr
        out = (tmp_path / "out").read_text()
        if out.strip():  # the protocol's promise first, with its reasons (a failure says why)
            report = json.loads(out)
            assert report["honest_invalidations"] == [], report["honest_invalidations"]
            assert report["honest_out_of_pool"] == {}, report["honest_out_of_pool"]
        assert returncode == 0, stderr
        assert restarted.returncode == 0, restarted.stderr
        report = json.loads(out)

        assert report["steps"] >= STEPS and len(report["curve"]) == report["steps"]
        assert all(0.0 <= r <= 1.0 for r in report["curve"])
        with open(report["curve_csv"]) as fh:
            rows = list(csv.DictReader(fh))
        assert [int(r["step"]) for r in rows] == list(range(1, report["steps"] + 1))

        cheater = state.account("node-3").address
        assert report["cheater"] == cheater and report["cheater_ejected"]
        before = report["cheater_stake_before"]  # the slash takes 50 tokens, or all there is
        assert before > 0 and report["cheater_stake_after"] == max(0, before - 50 * ONE_TOKEN)
        voters = {v["validator"] for v in report["slash_votes"]}
        assert voters == {"validator", "validator-2"}, report["slash_votes"]
        assert any("reward" in " ".join(v["reasons"]) for v in report["slash_votes"])
        assert report["files_accepted"] > 0 and report["files_judged"] > report["files_accepted"]

        ledger = LedgerClient(state.rpc_url, Path(state.deployment_path))
        assert not ledger.is_node_in_pool(state.pool_id, cheater)
        honest = [state.account(f"node-{i}").address for i in (1, 2)]
        assert all(ledger.is_node_in_pool(state.pool_id, n) for n in honest)
        earned = {n: report["claimable"][n] + report["pending"][n] for n in honest}
        assert all(v > 0 for v in earned.values()), earned
        assert report["claimable"][cheater] + report["pending"][cheater] == 0  # dropped with the slash
        # every worker proved its hardware before its invite (docs/hardware.md): what placement uses
        for node in [*honest, cheater]:
            figures = report["hardware"][node]
            assert figures["outcome"] == "proven" and figures["flops"] > 0 and figures["rtt_ms"] > 0, figures
        policy = ledger.slashing.policy(state.pool_id)
        assert (policy.quorum, len(ledger.slashing.validators(state.pool_id))) == (2, 2)
        # the devnet's workers submit in batches: every file on chain came in a submitWorkBatch
        reader = EventReader(ledger, pool_id=state.pool_id, kinds=("WorkSubmitted",))
        files = reader.read(ledger.deployment.block)
        assert files.events and all(getattr(e, "batch_index", None) is not None for e in files.events)
    finally:
        down = subprocess.run([INTELLECT, "devnet", "down", "--dir", str(directory)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    # (the trainer stopped by itself after its last step)
    for name in ("broadcast-relay", "validator", "validator-2", "worker-1", "worker-3", "anvil"):
        assert f"stopped {name}" in down.stdout
    leftovers = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if str(directory) in " ".join(proc.info["cmdline"] or []) + (proc.info["cwd"] or ""):
                leftovers.append(proc.info["cmdline"])
        except psutil.Error:
            continue
    assert leftovers == [], leftovers
    assert strays(directory) == []

    # The main command works every time: after `down`, a second demo in the same folder is a new run.
    # Its workers generate with vLLM (`--backend vllm`, issue 57) wherever vLLM's environment is
    # installed (CI: `make vllm`), and the validator pays every honest file under the tiny record's
    # vLLM part.
    backend = backend_for_the_second_run()
    again = ["devnet", "up", "--demo", "--dir", str(directory), "--workers", "2", "--validators", "1",
             "--quorum", "1", "--cheat", "none", "--steps", "2", "--timeout", "900", "--json",
             "--backend", backend]  # fmt: skip
    try:
        done = subprocess.run([INTELLECT, *again], capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout)
        assert report["steps"] >= 2 and report["files_accepted"] > 0, report
        assert "a new demo run" in done.stdout + done.stderr
        assert report["honest_invalidations"] == [] and report["honest_out_of_pool"] == {}, report
        if backend == "vllm":
            assert report["files_accepted"] == report["files_judged"], report
            task = json.loads((directory / "demo" / "task.json").read_text())
            assert task["workload"]["settings"]["backend"] == "vllm"
            assert task["entrypoint"][0] == vllm_python()  # the workers ran vLLM's environment
    finally:
        down = subprocess.run([INTELLECT, "devnet", "down", "--dir", str(directory)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert strays(directory) == []
