"""Calibrating the forward comparison of pipeline stages (issue 36, `workloads/pipeline/judge/replay.py`).

A stage before the last is judged on ‖sent − replay‖₂ / ‖replay‖₂ per real position, where the replay is
its layers run as one prefill over exactly the frames it received. This runs honest groups (2 and 3
members; batches of 1 to 64 rows; outputs of 1 to 48 tokens; prompts of several lengths; several
seeds) and groups with a cheating forwarder, through the real member protocol (threads, CURVE links on
loopback, node keys), and prints per case the worst position, the share of positions over the
per-position limit and the verdict; then the honest maxima against the limits (the margins) and the
weakest cheater.

    .venv/bin/python bench/pipeline_forward.py [--quick] [--out bench/out/pipeline_forward.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from workloads.model.loading import load_model, load_tokenizer
from workloads.pipeline.bundle import BatchRequest
from workloads.pipeline.group import run_thread_group
from workloads.pipeline.judge.replay import TINY_FORWARD, judge_member
from workloads.pipeline.stages import plan_stages

WORDS = ["abc", "hello", "pipeline", "stage", "group", "verify", "token", "proof", "a", "reverse me please",
         "zz", "longer prompt words here"]  # fmt: skip
CHEATS = ["weights", "noise", "small-flip", "sign-flip", "negate", "other-prompt", "skip"]


def request(tok, rows: int, tokens: int, seed: int) -> BatchRequest:  # noqa: ANN001
    prompts = [tok(f"reverse: {WORDS[(seed + i) % len(WORDS)]}")["input_ids"] for i in range(rows)]
    return BatchRequest(prompts, [seed * 1000 + i for i in range(rows)], tokens, 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and seeds")
    parser.add_argument("--out", type=Path, default=Path("bench/out/pipeline_forward.json"))
    args = parser.parse_args()
    tok, model = load_tokenizer("tiny"), load_model("tiny")
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id)
    shapes = (
        [(1, 1), (1, 48), (8, 24), (64, 8)]
        if args.quick
        else [
            (1, 1),
            (1, 8),
            (1, 48),
            (4, 48),
            (8, 1),
            (8, 24),
            (16, 48),
            (32, 16),
            (64, 1),
            (64, 8),
            (64, 32),
        ]
    )
    seeds = [1, 2] if args.quick else [1, 2, 3]
    lim = TINY_FORWARD
    cases = []
    started = time.time()
    for members in (2, 3):
        plans = plan_stages("tiny", members)
        runs = [(-1, "none")] + [(s, c) for s in range(members - 1) for c in CHEATS]
        for stage, cheat in runs:
            for rows, tokens in shapes:
                for seed in seeds if stage < 0 else seeds[:1]:
                    run = run_thread_group(members, request(tok, rows, tokens, seed),
                                           cheats={stage: cheat} if stage >= 0 else None)  # fmt: skip
                    for k in range(members - 1):
                        out = run.outputs[k]
                        v = judge_member(model, plans, k, out.bundle, out.received_frames,
                                         out.sent_frames, task_id="local", group_id="local", batch=1,
                                         eos=eos, pad=pad)  # fmt: skip
                        who = cheat if k == stage else "none"
                        cases.append({"members": members, "stage": k, "cheat": who,
                                      "rows": rows, "tokens": tokens, "seed": seed, "worst": v.worst,
                                      "share_out": v.share_out, "guilty": v.guilty})  # fmt: skip
    honest = [c for c in cases if c["cheat"] == "none"]
    worst = max(c["worst"] for c in honest)
    share = max(c["share_out"] for c in honest)
    print(
        f"{len(cases)} stage judgements in {time.time() - started:.0f} s; limits: position {lim.position}, "
        f"share {lim.share}, worst {lim.worst}"
    )
    print(
        f"honest ({len(honest)} stage-batches): worst position {worst:.4f} (limit "
        f"×{lim.position / worst:.1f} above it; one-position limit ×{lim.worst / worst:.1f}), "
        f"largest share over {lim.position}: {share:.3f}; "
        f"blamed: {sum(c['guilty'] for c in honest)}"
    )
    print(f"{'cheat':14} {'caught':>8} {'weakest worst':>14} {'weakest share':>14}")
    summary = {}
    for cheat in CHEATS:
        mine = [c for c in cases if c["cheat"] == cheat]
        caught = sum(c["guilty"] for c in mine)
        low_worst = min(c["worst"] for c in mine)
        low_share = min(c["share_out"] for c in mine)
        summary[cheat] = {"cases": len(mine), "caught": caught, "weakest_worst": low_worst,
                          "weakest_share": low_share}  # fmt: skip
        print(f"{cheat:14} {caught:>4}/{len(mine):<3} {low_worst:>14.4f} {low_share:>14.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"limits": vars(lim) if hasattr(lim, "__dict__") else lim.__repr__(),
                                    "honest_worst": worst, "honest_share": share, "cheats": summary,
                                    "cases": cases}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
