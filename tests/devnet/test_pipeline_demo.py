"""`intellect devnet up --demo --pipeline 2` end to end, as a user runs it: the RL run of the demo with
its rollouts made by 2-member node groups (each member one stage of the trainer's checkpoint), one
member run by a cheating operator (its layers skipped, at whichever stage it is given). The trainer
takes its steps on the groups' validated batches, the quorum slashes and ejects the cheater and only
the cheater (its partner's files of the blamed batches are not paid, never voted invalid), the other
group's members earn, and `intellect-pool audit --group` on the stored files says so batch by batch.
Every hop of the groups' rings goes through a delay relay (`--link-delay 20ms`),
and the groups keep batches in flight to hide it. (The reward's rise over many steps is measured by the
bench, not asserted here.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devnet.state import DevnetState
from ledger.client import LedgerClient
from ledger.models import ONE_TOKEN

INTELLECT = str(Path(sys.executable).parent / "intellect")
POOL = str(Path(sys.executable).parent / "intellect-pool")
STEPS = 3


@pytest.mark.slow
@pytest.mark.timeout(1900)
def test_pipeline_demo_trains_on_group_batches_and_slashes_only_the_cheating_member(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    argv = [INTELLECT, "devnet", "up", "--demo", "--pipeline", "2", "--cheat", "skip", "--link-delay", "20ms",
            "--dir", str(directory), "--workers", "4", "--validators", "2", "--quorum", "2",
            "--steps", str(STEPS), "--timeout", "1500", "--json"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        state = DevnetState.load(directory)
        assert state is not None, done.stderr[-3000:]
        if done.stdout.strip():  # the protocol's promise first, with its reasons
            report = json.loads(done.stdout)
            assert report["honest_invalidations"] == [], report["honest_invalidations"]
            assert report["honest_out_of_pool"] == {}, report["honest_out_of_pool"]
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout)
        assert report["steps"] >= STEPS and all(0.0 <= r <= 1.0 for r in report["curve"])

        cheater = state.account("node-4").address
        assert report["cheater"] == cheater and report["cheater_ejected"]
        before = report["cheater_stake_before"]
        assert before > 0 and report["cheater_stake_after"] == max(0, before - 50 * ONE_TOKEN)
        assert {v["validator"] for v in report["slash_votes"]} == {"validator", "validator-2"}
        assert any("stage" in " ".join(v["reasons"]) for v in report["slash_votes"]), report["slash_votes"]
        assert report["files_accepted"] > 0
        relays = [p for p in state.processes if p.name.startswith("link-")]
        assert len(relays) == 8 and all(p.alive() for p in relays)  # two a worker: inbox, listening outbox
        for index in range(1, 5):  # every member's predecessor reached its inbox through the relay
            assert "relaying a connection" in Path(directory / f"link-{index}.log").read_text(), index

        ledger = LedgerClient(state.rpc_url, Path(state.deployment_path))
        assert not ledger.is_node_in_pool(state.pool_id, cheater)
        honest = [state.account(f"node-{i}").address for i in (1, 2, 3)]
        assert all(ledger.is_node_in_pool(state.pool_id, n) for n in honest)
        earned = [n for n in honest if report["claimable"][n] + report["pending"][n] > 0]
        assert len(earned) >= 2, report["claimable"]  # the honest group (the cheater's partner may not)
        assert report["claimable"][cheater] + report["pending"][cheater] == 0

        # The pool owner's audit of the run's group batches, from the stored files and the chain.
        stored = sorted((directory / "orchestrator" / "storage").rglob("pipeline-batch*.json"))
        audit = subprocess.run(
            [POOL, "audit", *(a for f in stored for a in ("--group", str(f))), "--json", "--rpc-url",
             state.rpc_url, "--deployment", state.deployment_path],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert audit.returncode == 0, audit.stderr[-2000:]
        batches = json.loads(audit.stdout)["batches"]
        gaps = ("no file given", "never submitted")  # a batch still uploading when the run ended
        assert all(any(g in p for g in gaps) for b in batches for p in b["problems"]), batches
        slashed = {v["work_key"] for v in report["slash_votes"]}
        blamed = [m for b in batches if any(m["work_key"] in slashed for m in b["members"])
                  for m in b["members"]]  # fmt: skip
        assert blamed and cheater in {m["node"] for m in blamed}
        for m in blamed:  # the cheater's files dropped with its stake, its partner's never voted invalid
            if m["node"] == cheater:
                assert m["status"] in ("invalidated", "dropped") and m["votes"], m
            else:
                assert m["status"] != "invalidated", m
                assert not any(v["verdict"] == "invalidate" for v in m["votes"]), m
        honest_batch = [b for b in batches if all(m["status"] == "submitted" for m in b["members"])]
        assert honest_batch and all(m["units_on_chain"] == m["units"] > 0 for m in honest_batch[0]["members"])
    finally:
        down = subprocess.run([INTELLECT, "devnet", "down", "--dir", str(directory)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
