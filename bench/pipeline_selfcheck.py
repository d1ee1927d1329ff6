"""What a member's judge of its own file costs (issue 55, `workloads/pipeline/selfcheck.py`): per member,
the batch's time in the group (its self-check included) against the time of the self-check alone (one
prefill of its layers over the batch, its proofs against that replay), for the shipped models.

    .venv/bin/python bench/pipeline_selfcheck.py [--rows 8] [--tokens 32] [--json]

Members run as threads of this process (`run_thread_group`), so the batch time includes their sharing
the machine's cores; the ratio is the figure to read."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from workloads.model.loading import load_tokenizer
from workloads.model.shapes import build_model_dir
from workloads.pipeline.bundle import BatchRequest
from workloads.pipeline.group import run_thread_group
from workloads.pipeline.selfcheck import SelfCheck, limits_for
from workloads.pipeline.stages import load_stage, plan_stages

OUT = Path(__file__).resolve().parent / "out" / "pipeline_selfcheck.json"


def measure(model: str, members: int, rows: int, tokens: int) -> list[dict[str, float]]:
    tok = load_tokenizer(model)
    prompts = [list(tok(f"reverse: word{i} and more")["input_ids"]) for i in range(rows)]
    request = BatchRequest(prompts, list(range(rows)), tokens, 1.0)
    run = run_thread_group(members, request, model=model)
    if not run.ok:
        raise RuntimeError(f"{model}: the group failed: {run.errors}")
    figures = []
    for i in range(members):
        out = run.outputs[i]
        stage = load_stage(model, plan_stages(model, members)[i])
        check = SelfCheck(limits_for(model))
        started = time.perf_counter()
        check.check(stage, out.bundle, out.received_frames, out.sent_frames, task_id="local",
                    group_id="local", batch=1, eos=int(tok.eos_token_id), pad=int(tok.pad_token_id),
                    prev=(i - 1) % members)  # fmt: skip
        seconds = time.perf_counter() - started
        figures.append({"model": model, "members": members, "stage": i,
                        "batch_seconds": round(out.seconds, 3), "selfcheck_seconds": round(seconds, 3),
                        "ratio": round(seconds / out.seconds, 3)})  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true", help=f"also write {OUT}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    small = str(build_model_dir("small", OUT.parent / "models"))  # the 512 × 8 shape, seeded weights
    figures = [f for model in ("tiny", small) for members in (2, 3)
               for f in measure(model, members, args.rows, args.tokens)]  # fmt: skip
    for f in figures:
        f["model"] = "small (512 × 8)" if f["model"] == small else f["model"]
    print(f"{args.rows} rows × {args.tokens} tokens, one torch thread")
    print("| model | members | stage | batch s | self-check s | self-check / batch |")
    print("|---|---|---|---|---|---|")
    for f in figures:
        cells = [f["model"], f["members"], f["stage"], f["batch_seconds"], f["selfcheck_seconds"]]
        print("| " + " | ".join(map(str, cells)) + f" | {f['ratio']:.1%} |")
    if args.json:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
