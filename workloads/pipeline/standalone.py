"""`python -m workloads.pipeline --index I --members N ...`: one member of a pipeline group told everything
by flags, outside any task: what `group.py` starts per member (tests, benches, the devnet's hosts), and
what a person runs by hand.

    INTELLECT_PIPELINE_MEMBER_SECRET=<hex> INTELLECT_PIPELINE_GROUP_KEYS=<hex>,<hex> \\
        python -m workloads.pipeline --index 1 --members 2 \\
        --bind tcp://0.0.0.0:5601 --next tcp://10.0.0.1:5600 --out member-1.json

The two variables are this member's own CURVE secret and every member's public key in stage order
(`transport.MemberKeys`), 64 hex characters each: what a worker hands its task as `${MEMBER_SECRET}`
and `${GROUP_KEYS}`, and `group.py` makes up for a local group.

A member behind NAT replaces `--bind` by `--dial-prev` (its predecessor, which then gives
`--listen-next` instead of `--next`): every link is opened by whichever end can make the call.

Stage 0 also takes `--request` (a JSON file: prompts, seeds, max_new_tokens, temperature; or a list
of them, one batch each, the others then given `--batches N`; `--in-flight K` keeps up to K of them
moving at once, `flight.py`). Each member writes what it made (its
proofs; stage 0 and the last also the tokens) to `--out` as JSON (a list for several batches;
`output_json`, read back by `output_from_json`), or, when a peer failed, `{"error": ..., "member":
<index of the member at fault>}` and exits 3. With its node key in `INTELLECT_PIPELINE_NODE_KEY` (and
its address in `--address`) a member signs its link commitments and checks its predecessor's
(`commit.py`); without, nothing is signed.

A member run by a worker as its task is `workload.py` (`python -m workloads.pipeline task`): the same
`Member`, its settings from the task's environment and its batches written as files for the chain.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from workloads.pipeline.commit import signer_from_env
from workloads.pipeline.draft import DRAFTS, MAX_DRAFT_TOKENS, Draft, check_draft, make_draft, trip_guesses
from workloads.pipeline.member import BatchRequest, GroupBundle, Member, Policy, StageOutput
from workloads.pipeline.options import CHEATS
from workloads.pipeline.selfcheck import limits_for
from workloads.pipeline.stages import Stage, StageError, load_stage, plan_stages
from workloads.pipeline.transport import MemberError, MemberKeys, MemberLink

SECRET_ENV = "INTELLECT_PIPELINE_MEMBER_SECRET"  # this member's own transport secret (hex)
KEYS_ENV = "INTELLECT_PIPELINE_GROUP_KEYS"  # every member's public key, comma-separated, in stage order


def _frames_json(frames: list[list[bytes]]) -> list[list[str]]:
    return [[base64.b64encode(p).decode() for p in parts] for parts in frames]


def _frames_from_json(frames: list[list[str]]) -> list[list[bytes]]:
    return [[base64.b64decode(p) for p in parts] for parts in frames]


def output_json(out: StageOutput) -> dict:
    data = asdict(out)
    data["proofs"] = [p.hex() for p in out.proofs]
    data["bundle"] = out.bundle.header() if out.bundle else None
    data["received_frames"] = _frames_json(out.received_frames)
    data["sent_frames"] = _frames_json(out.sent_frames)
    return data


def output_from_json(data: dict) -> StageOutput:
    bundle = GroupBundle.from_header(data["bundle"]) if data.get("bundle") else None
    return StageOutput(**{**data, "proofs": [bytes.fromhex(p) for p in data["proofs"]],
                          "layers": tuple(data["layers"]), "bundle": bundle,
                          "received_frames": _frames_from_json(data.get("received_frames") or []),
                          "sent_frames": _frames_from_json(data.get("sent_frames") or [])})  # fmt: skip


def keys_from_env(index: int, members: int) -> MemberKeys:
    """This member's transport keys from `SECRET_ENV` and `KEYS_ENV`, checked before a model loads."""
    try:
        keys = MemberKeys.from_hex(os.environ.get(SECRET_ENV, ""), os.environ.get(KEYS_ENV, ""))
    except ValueError:
        raise ValueError(f"{SECRET_ENV} must hold this member's transport secret and {KEYS_ENV} every "
                         "member's public key (64 hex characters each)") from None
    if len(keys.publics) != members:
        raise ValueError(f"{KEYS_ENV} holds {len(keys.publics)} keys for {members} members")
    keys.check(index)
    return keys


def parser() -> argparse.ArgumentParser:
    summary = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m workloads.pipeline", description=summary,
                                epilog="`python -m workloads.pipeline task`: one member run by a worker as "
                                "its task, its settings from INTELLECT_PIPELINE_* variables (workload.py)")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--members", type=int, required=True)
    p.add_argument("--model", default="tiny")
    p.add_argument("--weights", type=Path, default=None, help="safetensors of the whole model")
    p.add_argument("--bind", help="this member's inbox, e.g. tcp://127.0.0.1:5600")
    p.add_argument("--next", help="the next member's inbox")
    p.add_argument("--dial-prev", help="behind NAT: instead of --bind, dial the predecessor's listening "
                   "outbox (its --listen-next)")
    p.add_argument("--listen-next", help="instead of --next, listen here for a next member behind NAT")
    p.add_argument("--request", type=Path, help="stage 0: the batch to generate (JSON; a list: batches)")
    p.add_argument("--batches", type=int, default=1, help="stages 1..n-1: how many batches to serve")
    p.add_argument("--in-flight", type=int, default=1, help="stage 0: batches moving at once (1-64)")
    p.add_argument("--draft", default="none", help="guess tokens for the group to check in "
                   f"one trip (exact: the same output as without): {', '.join(DRAFTS)}")
    p.add_argument("--draft-tokens", type=int, default=4,
                   help=f"tokens guessed a trip (0-{MAX_DRAFT_TOKENS}): members refuse a wider trip")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--address", default="", help="this member's node address (named in the bundle)")
    p.add_argument("--cheat", choices=CHEATS, default="none", help="tests and demos only")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a peer may stay silent")
    p.add_argument("--max-frame-bytes", type=int, default=64 << 20)
    p.add_argument("--eos", type=int, default=None, help="end-of-sequence id (default the tokenizer's; "
                   "-1: fixed-length outputs, for benches)")
    return p


def checked_keys(args: argparse.Namespace) -> MemberKeys:
    """The flags checked together, before a model loads, and this member's transport keys. Raises
    ValueError naming the first flag (or variable) that is wrong."""
    if not 0 <= args.index < args.members:
        raise ValueError(f"--index {args.index} is not in a group of {args.members} (0..{args.members - 1})")
    keys = keys_from_env(args.index, args.members)
    if (args.bind is None) == (args.dial_prev is None) or (args.next is None) == (args.listen_next is None):
        raise ValueError("give one of --bind and --dial-prev, and one of --next and --listen-next")
    try:
        check_draft(args.draft)
    except ValueError as exc:
        raise ValueError(f"--draft: {exc}") from None
    if not 0 <= args.draft_tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(f"--draft-tokens {args.draft_tokens}: between 0 and {MAX_DRAFT_TOKENS}")
    if not 1 <= args.in_flight <= 64:
        raise ValueError(f"--in-flight {args.in_flight}: between 1 and 64 batches")
    if (args.index == 0) != (args.request is not None):
        raise ValueError("--request is for stage 0 (the driver) and only for it")
    return keys


def read_requests(path: Path | None) -> tuple[object, list[BatchRequest]]:
    """Stage 0's `--request` file as given (one batch or a list) and as batch requests."""
    given = json.loads(path.read_text()) if path else None
    batches = given if isinstance(given, list) else [given] if given else []
    requests = [BatchRequest(**{**r, "policy": Policy.from_header(r["policy"])} if "policy" in r else r)
                for r in batches]  # fmt: skip
    return given, requests


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        keys = checked_keys(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    try:
        plan = plan_stages(args.model, args.members)[args.index]
        given, requests = read_requests(args.request)
    except (StageError, OSError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stage = load_stage(args.model, plan, args.weights)
    try:
        draft = make_draft(args.draft) if args.index == 0 else None  # the driver guesses; all bound trips
    except ValueError as exc:
        print(f"error: --draft: {exc}", file=sys.stderr)
        return 2
    return serve(args, keys, stage, draft, requests, several=isinstance(given, list) or args.batches > 1)


def serve(args: argparse.Namespace, keys: MemberKeys, stage: Stage, draft: Draft | None,
          requests: list[BatchRequest], *, several: bool) -> int:  # fmt: skip
    """Join the ring, run the batches, write what this member made (a list when `several`) or the
    error that stopped the group (exit 3)."""
    from workloads.model.loading import load_tokenizer

    tok = load_tokenizer(args.model)
    link = MemberLink(args.index, keys, args.bind, args.next,
                      max_frame_bytes=args.max_frame_bytes, timeout=args.timeout,
                      inbox_dial=args.dial_prev, outbox_bind=args.listen_next)  # fmt: skip
    link.connect()
    eos = int(tok.eos_token_id) if args.eos is None else args.eos
    member = Member(stage, link, eos, int(tok.pad_token_id), cheat=args.cheat, address=args.address,
                    signer=signer_from_env(), draft=draft, self_limits=limits_for(args.model),
                    draft_tokens=trip_guesses(args.draft, args.draft_tokens))  # fmt: skip
    outputs: list[dict] = []
    try:
        member.introduce()
        made = member.serve(requests or None, in_flight=args.in_flight,
                            batches=None if requests else args.batches)  # fmt: skip
        outputs = [output_json(out) for out in sorted(made, key=lambda o: o.started)]
    except MemberError as exc:
        args.out.write_text(json.dumps({"error": str(exc), "member": exc.member, "from": args.index}))
        return 3
    finally:
        link.close()
    args.out.write_text(json.dumps(outputs if several else outputs[0]))
    return 0
