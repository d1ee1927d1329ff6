"""One-token rows (`max_new_tokens = 1`, issue 37.6): how far an honest first token's logprob is from
the validator's recomputation, against N(0, 1e-2) on one weight matrix, and what the full pipeline
says of each file. Honest files at generation batch 1, 4 and 16 with 1 and 2 torch threads; one
validator (its node window grows over the files of a kind). Figures in docs/validator.md "Grades".

    .venv/bin/python bench/one_token_rows.py [--files 8] [--out /tmp/one-token]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from intellect.wire.verdicts import Submission  # noqa: E402
from intellect.workloads import MemoryNodeWindows, MemorySeenStore  # noqa: E402
from workloads.inference.judge.file_judge import InferenceJudge  # noqa: E402
from workloads.inference.settings import InferenceSettings  # noqa: E402
from workloads.inference.task import TaskSettings  # noqa: E402
from workloads.inference.workload import InferenceWorkload  # noqa: E402
from workloads.model.loading import ModelCheckpoints  # noqa: E402

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"
KINDS = [("honest, batch 1, 1 thread", 1, 1, {}), ("honest, batch 4, 1 thread", 4, 1, {}),
         ("honest, batch 16, 2 threads", 16, 2, {}),
         ("N(0, 1e-2) on one matrix", 16, 2, {"cheat": "perturbed-model"}),
         ("fp16 weights", 16, 2, {"dtype": "float16"})]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/one-token"))
    args = parser.parse_args()
    report = {}
    for name, batch, threads, kw in KINDS:
        torch.set_num_threads(threads)
        task = TaskSettings(batch_size=batch, n=4, max_new_tokens=1, target_lengths=[1])
        workload = InferenceWorkload(InferenceSettings(
            node_address=NODE, output_dir=args.out / name.replace(" ", "_"), batch_size=batch, n=4,
            max_new_tokens=1, target_lengths=[1], **kw,
        ))  # fmt: skip
        pipeline = InferenceJudge(task, MemorySeenStore(), ModelCheckpoints("tiny"),
                                  windows=MemoryNodeWindows())  # fmt: skip
        files = []
        for _ in range(args.files):
            verdict = pipeline.judge(Path(workload.run_batch().path), Submission(node=NODE))  # type: ignore[union-attr]
            s = pipeline.last_stats
            mean = s.lp_abs_sum / max(1, s.lp_tokens) if s else None
            files.append({"verdict": verdict.verdict, "mean_abs_error": mean,
                          "max_error": s.max_logprob_error if s else None})  # fmt: skip
        report[name] = files
        verdicts = [f["verdict"] for f in files]
        worst = max((f["max_error"] or 0.0) for f in files)
        means = [f["mean_abs_error"] for f in files if f["mean_abs_error"] is not None]
        print(f"{name:30s} invalidate {verdicts.count('invalidate')}/{len(files)}  mean |error| "
              f"{min(means, default=0):.4f}-{max(means, default=0):.4f}  max {worst:.4f}", flush=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
