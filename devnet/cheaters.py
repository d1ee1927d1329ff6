"""Cheating workers for the devnet: `python -m devnet.cheaters KIND -- <intellect-worker arguments>`.

The devnet's other cheats live in the task (`INTELLECT_INFER_CHEAT`, a pipeline member's cheat): the
worker around them is honest. The three here live in the worker itself, so they are run the way a
dishonest contributor would run them: the worker's own program with one function replaced, in its own
process. The product code stays honest; this module patches one seam of it (monkeypatching in this
process only) and then calls the worker's command line (`worker.cli:app`, the `intellect-worker`
script) with the arguments given. Kinds, and the rule that is meant to catch each:

- `withhold`: every file is submitted on chain as an honest node submits it (`submitWork` with its
  sha256 and units), and never sent to storage: the upload is asked for (the orchestrator grants it,
  so it knows the file and its task) and the PUT is skipped (`Uploader._put`). The validators find no
  completed upload (`GET /storage/files/{sha256}` → 404, `validator/fetch.py` `FileMissing`) and, once
  the availability window after the submission has passed, `invalidate` it ("data availability",
  `validator/judging.py` `JudgeLoop._unfetched`): voted like any bad file, so the node is slashed and
  ejected by the pool's quorum, not merely unpaid.
- `copy`: each file the node's task made is swapped, before its upload, for another node's file of the
  same task, taken from the pool's storage (`Uploader.upload`). A byte-for-byte copy is refused at the
  door (one sha256 is one work key: the orchestrator answers 409 to a second node's upload,
  `orchestrator/uploads.py`, and the chain reverts a second `submitWork` with `WorkAlreadySubmitted`),
  so it is never paid nor judged; a copier that hopes to be paid re-encodes the file (JSON written
  again, parquet with another codec: the same rows, a new sha256) and uploads and submits it under
  its own name. The judges derive each file's work from its node (arith: `ArithJudge.judge`,
  "problems of node X, submitted by Y", and "already paid" once the original was accepted; inference:
  `plan_derivation` in `workloads/inference/judge/checks/history.py`, "the file was planned for node X,
  submitted by Y", and `duplicates` there for rows already seen), so the copy is `invalidate`d and its
  node slashed.
- `hardware`: the node answers the orchestrator's hardware challenge (docs/hardware.md) with a product
  it computed once for a challenge of its own, committed and opened for every challenge it is sent
  (`HardwareProver.commit`): the liar of tests/orchestrator/test_orch_lifecycle.py's `ReplayingProver`,
  in a real worker. The orchestrator's Freivalds check refuses the invite ("hardware challenge
  answered wrongly", `orchestrator/invites.py` `hardware_passes`) and, after 3 such answers, bans it.

Where `copy` finds other nodes' files: `INTELLECT_CHEAT_COPY_FROM` (a folder searched for the files of
the task), by default the devnet's embedded storage, `<devnet>/orchestrator/storage/objects` (found from
`INTELLECT_HOME`, `<devnet>/home`). With `up --hosts` the uploads live on an S3 host instead: point it at
another worker's data folder (`<devnet>/worker-1/data`, whose task folders are named by task id).

`cheater_argv` turns the devnet's worker command into this one; `WORKER_CHEATS` names the kinds.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:  # the worker is imported only once a cheat is chosen: `--help` stays instant
    import httpx

    from intellect.wire.hardware import HardwareChallenge, HardwareCommitment
    from intellect.wire.storage import UploadGrant
    from worker.files import WorkerFile
    from worker.proof import HardwareProver, _Held
    from worker.uploader import Uploader

WORKER_CHEATS = ("withhold", "copy", "hardware")
COPY_FROM_ENV = "INTELLECT_CHEAT_COPY_FROM"
COPIES_DIR = "cheat-copies"  # in the bridge's folder, next to the file record: the copies to upload
REPLAYED_CHALLENGE = "c0" * 32  # the one challenge the `hardware` liar ever computes a product for

log = structlog.get_logger("intellect.devnet.cheaters")

DESCRIPTIONS = {
    "withhold": "submit every file on chain, never send it to storage (slashed for data availability)",
    "copy": "upload and submit another node's file of the task, re-encoded, as its own (slashed: "
    "another node's work)",
    "hardware": "answer every hardware challenge with one product computed once (refused the invite, "
    "then banned)",
}


def cheater_argv(kind: str, worker_argv: list[str]) -> list[str]:
    """The command that runs the worker `worker_argv` (its first item the `intellect-worker` program)
    as the cheater `kind`: the same arguments, through this module, in this Python."""
    if kind not in WORKER_CHEATS:
        raise ValueError(f"unknown worker cheat {kind!r}: use one of {', '.join(WORKER_CHEATS)}")
    return [sys.executable, "-m", "devnet.cheaters", kind, "--", *worker_argv[1:]]


def replace(owner: type, name: str, function: Callable[..., Any]) -> None:
    """Put `function` in place of `owner.name` for this process. A seam that is gone (renamed, moved)
    stops the cheater at start: one quietly running the honest code would look like a cheat the
    protocol misses."""
    if not callable(getattr(owner, name, None)):
        raise RuntimeError(f"{owner.__qualname__}.{name} is gone: move the cheat to its new seam")
    setattr(owner, name, function)


# ---- withhold: the bytes never reach storage ----


def withhold() -> None:
    """`Uploader._put` (the one call that sends the bytes) does nothing: the uploader then records the
    file as uploaded under the grant's name and submits it on chain, exactly as after an honest PUT."""
    from worker.uploader import Uploader

    def put(self: Uploader, client: httpx.Client, grant: UploadGrant, item: WorkerFile) -> None:
        log.warning("cheat: withheld the file from storage", file=item.relative_path, sha256=item.sha256[:12])

    replace(Uploader, "_put", put)


# ---- copy: another node's file, as this node's own ----


def copy_source() -> Path:
    """The folder other nodes' files are taken from (module docstring)."""
    given = os.environ.get(COPY_FROM_ENV)
    if given:
        return Path(given)
    home = os.environ.get("INTELLECT_HOME")
    if not home:
        raise RuntimeError(f"the copy cheat needs {COPY_FROM_ENV} (a folder with other nodes' files) or a "
                           "devnet's INTELLECT_HOME")  # fmt: skip
    return Path(home).parent / "orchestrator" / "storage" / "objects"


def foreign_files(root: Path, task_id: str, node: str) -> list[Path]:
    """Files under `root` of task `task_id` (named in their path, as the storage's default names are:
    `<task>/<node>/<index>-<name>`) that are not `node`'s (its address nowhere in the path), oldest
    first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.rglob("*"):
        where = str(path.relative_to(root)).lower()
        if task_id.lower() in where and node.lower() not in where and path.is_file():
            found.append(path)
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def reencoded(data: bytes) -> bytes:
    """The same content in other bytes (so another sha256, another work key): JSON written again,
    parquet rewritten with another codec (the same table), anything else with a newline added."""
    if data.startswith(b"PAR1"):
        import pyarrow.parquet as pq

        original = pq.ParquetFile(io.BytesIO(data))
        meta = original.metadata
        codec = str(meta.row_group(0).column(0).compression) if meta.num_row_groups else "NONE"
        out = io.BytesIO()
        pq.write_table(original.read(), out, compression="zstd" if codec.upper() == "GZIP" else "gzip")
        return out.getvalue()
    try:
        again = json.dumps(json.loads(data), indent=1).encode()
    except (ValueError, UnicodeDecodeError):
        again = data
    return again if again != data else data + b"\n"


def copied_units(data: bytes, claimed: int) -> int:
    """The units the copied file is worth by its own rows (a rollout file: its output tokens), so the
    copier's claim matches what it submits and no units rule gives it away: what must catch it is that
    the work was another node's. A file of another kind keeps the task's claim."""
    if not data.startswith(b"PAR1"):
        return claimed
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    if "output_tokens" not in table.column_names:
        return claimed
    return sum(len(tokens) for tokens in table.column("output_tokens").to_pylist())


def copy() -> None:
    """`Uploader.upload` swaps the task's own file for a copy of another node's (`foreign_files`,
    `reencoded`) that this node has not used yet: the copy is recorded as announced, with the units the
    task claimed (uploaded on the uploader's next pass, then submitted as any file), and the task's
    file as refused. A copy is uploaded by the honest method. With no other node's file in storage yet
    the file waits: "retry later", the uploader's answer to a refusal that may change."""
    from worker.uploader import Uploader, UploadRefused

    honest = Uploader.upload

    def upload(self: Uploader, client: httpx.Client, base: str, item: WorkerFile) -> None:
        copies = self.files.path.parent / COPIES_DIR
        if item.path.parent == copies:
            honest(self, client, base, item)
            return
        for source in foreign_files(copy_source(), item.task_id, self.chain.node):
            data = reencoded(source.read_bytes())
            sha = hashlib.sha256(data).hexdigest()
            if self.files.find(sha) is not None:  # copied before: the record keeps every sha256
                continue
            target = copies / f"{sha[:16]}-{source.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            units = copied_units(data, item.work_units)
            self.files.add(item.task_id, target, item.relative_path, sha, units, len(data))
            self.files.mark_refused(item.id, f"cheat: replaced by another node's file {source.name}")
            log.warning("cheat: another node's file recorded as this node's", source=str(source),
                        sha256=sha[:12], instead_of=item.sha256[:12])  # fmt: skip
            return
        raise UploadRefused(f"cheat: no other node's file of task {item.task_id} to copy yet", final=False)

    replace(Uploader, "upload", upload)


# ---- hardware: one product, replayed for every challenge ----


def hardware() -> None:
    """`HardwareProver.commit` commits, for every challenge, to the product of the matrices of
    `REPLAYED_CHALLENGE` (computed once per size by the honest code, then kept), signed for the challenge
    asked; the honest reveal then opens that product's rows and C·r for the challenger's probe."""
    from intellect.wire.hardware import HardwareCommitment, commitment_text
    from worker.proof import HardwareProver

    honest = HardwareProver.commit
    kept: dict[tuple[int, str], _Held] = {}

    def commit(self: HardwareProver, challenge: HardwareChallenge) -> HardwareCommitment:
        size = (challenge.n, challenge.precision)
        if size not in kept:
            honest(self, challenge.model_copy(update={"challenge_id": REPLAYED_CHALLENGE}))
            assert self._held is not None
            kept[size] = self._held
        with self._lock:
            self._held = held = dataclasses.replace(kept[size], challenge=challenge, at=time.monotonic())
        root = held.levels[-1][0].hex()
        signature = self.sign(commitment_text(challenge, self.node_address, root))
        log.warning("cheat: answered a hardware challenge with a replayed product",
                    challenge=challenge.challenge_id[:16])  # fmt: skip
        return HardwareCommitment(challenge_id=challenge.challenge_id, node_address=self.node_address,
                                  root=root, seconds=0.0, signature=signature)  # fmt: skip

    replace(HardwareProver, "commit", commit)


PATCHES: dict[str, Callable[[], None]] = {"withhold": withhold, "copy": copy, "hardware": hardware}


def parser() -> argparse.ArgumentParser:
    kinds = "\n".join(f"  {kind:9} {DESCRIPTIONS[kind]}" for kind in WORKER_CHEATS)
    made = argparse.ArgumentParser(
        prog="python -m devnet.cheaters",
        description="Run intellect-worker as a cheater (devnet and tests only): the worker's own program "
        "with one seam replaced. Everything after `--` goes to intellect-worker.",
        epilog=f"kinds:\n{kinds}\n\nexample: python -m devnet.cheaters withhold -- start --yes "
        "--runtime process --api-port 8101",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    made.add_argument("kind", choices=WORKER_CHEATS, help="which cheat (below)")
    return made


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    head, worker_args = (args[: args.index("--")], args[args.index("--") + 1:]) if "--" in args \
        else (args[:1], args[1:])  # fmt: skip
    kind = parser().parse_args(head).kind
    PATCHES[kind]()
    print(f"devnet.cheaters: this worker cheats ({kind}): {DESCRIPTIONS[kind]}", file=sys.stderr, flush=True)
    from worker.cli import app

    app(args=worker_args, prog_name="intellect-worker")


if __name__ == "__main__":
    main()
