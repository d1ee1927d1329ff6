"""GPU bench: generation and validation tokens/s of the project's own code on models of the shape
users run, TOPLOC's cost, and an honest calibration of the validator's thresholds across devices.

    bench/gpu/run.sh                        # on a lent GPU machine (installs the .whl wheels first)
    bench/gpu/run.sh --quick                # tiny sizes on the CPU, under a minute: proves the script
    python3 bench/gpu/bench.py --models qwen2-0.5b --tokens 256 --batch 16 --out /tmp/gpu

Models: random weights (seeded, bf16, no hub needed) in the real Qwen2-0.5B and Qwen2-1.5B shapes
(hidden, layers, heads, KV heads, MLP width, vocabulary 151,936; tied embeddings), built from a
transformers Qwen2Config. Random weights sample nearly uniformly over the vocabulary: the costs are
those of a real model of that shape, the calibration is that of such a model (a trained checkpoint
has sharper distributions and more near ties: docs/validator.md).

Per cell (model x output tokens x batch), EOS off so every row decodes the full length:
- generation: `make_rollouts` (the workload's path: `TorchBackend` batched KV-cache decoding, seeded
  Gumbel sampling, rewards) with hidden-state capture and TOPLOC proofs, and later without them;
- the file: `write_rollouts` as the workload writes it, read back with `read_rollouts`;
- validation: `workloads.inference.judge.checks.model.recompute` on the validator's device (one batched
prefill,
  Gumbel replay, logprobs, termination, TOPLOC per chunk and per file) with the shipped thresholds.
val / gen = validation tokens/s / generation tokens/s with proofs: how many such workers one
validator keeps up with on the same GPU.

Calibration: every cell's file is an honest file made on the GPU; it is judged on the GPU (above)
and, for one small file (the 0.5B at 256 tokens, batch 16), also by a CPU copy of the same weights,
as a pool with CPU validators would judge GPU workers. The report gives the honest files invalidated
(false positives) and the worst honest value of each statistic next to its limit.

Time: the most important figures first (`run_all`); every step's cost is predicted from the decode
steps measured so far, and one that would not fit the budget (`--budget`, default 400 s) is skipped
and says so. Results are rewritten after each step to `--out` (default `$OUT`, else bench/out/gpu):
gpu_bench.json and gpu_bench.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# The repository root instead of bench/gpu (whose bench.py would shadow the `bench` folder).
sys.path[0] = str(HERE.parents[1])

import transformers  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from bench.gpu.summary import Cell, Judged, Report, markdown, verdict, write  # noqa: E402
from intellect.device import ATTENTION, model_dtype, resolve_device, synchronize  # noqa: E402
from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import make_rollouts  # noqa: E402
from workloads.inference.judge.calibration import resolve_limits  # noqa: E402
from workloads.inference.judge.checks.model import recompute  # noqa: E402
from workloads.inference.judge.checks.tokens import token_checks  # noqa: E402
from workloads.inference.selection import BatchPlan, plan_batch  # noqa: E402
from workloads.model import sampler  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.gemm import prefill_in_fp32  # noqa: E402
from workloads.model.loading import load_tokenizer  # noqa: E402
from workloads.model.prefill import prefill_batch  # noqa: E402
from workloads.rollouts import BatchInfo, read_rollouts, write_rollouts  # noqa: E402
from workloads.toploc import verify_proofs_batch  # noqa: E402

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"
STEP, GROUP = 1, 4  # rows come in GRPO groups of 4 completions of one prompt
QWEN2_VOCAB = 151_936
# name: (hidden, layers, attention heads, KV heads, MLP width, vocabulary): Qwen2-0.5B and -1.5B's
# config.json, and a toy of the same family for --quick.
SHAPES = {
    "qwen2-0.5b": (896, 24, 14, 2, 4864, QWEN2_VOCAB),
    "qwen2-1.5b": (1536, 28, 12, 2, 8960, QWEN2_VOCAB),
    "toy": (64, 2, 4, 2, 128, 4096),
}

started = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)


def build_model(name: str, device: torch.device, seed: int = 0) -> Qwen2ForCausalLM:
    """Random weights in a Qwen2 shape, made on the device itself (seconds, not minutes, for 1.5B)."""
    hidden, layers, heads, kv_heads, mlp, vocab = SHAPES[name]
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=1, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )  # fmt: skip
    # Attention: transformers' default for Qwen2, SDPA (the implementation used is in the report's meta).
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    # transformers types `to` as the unbound nn.Module.to (see workloads/model/loading.py).
    return model.to(model_dtype(device)).eval()  # type: ignore[arg-type]


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - started)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - t0, result


@dataclass
class Job:
    """One cell's model and generation inputs, kept for its second (plain) generation run."""

    model: Qwen2ForCausalLM
    cell: Cell
    plan: BatchPlan


class Bench:
    def __init__(self, args: argparse.Namespace, device: torch.device, report: Report, out: Path) -> None:
        self.args, self.device, self.report, self.out = args, device, report, out
        self.label = "gpu" if device.type == "cuda" else device.type  # where the bench recomputes
        self.budget = Budget(args.budget)
        self.tokenizer = load_tokenizer("tiny")  # prompts; ids beyond its 99 decode to nothing
        self.records = load_dataset("demo")
        self.thresholds = resolve_limits("tiny", {}).thresholds  # the tiny record, as every judge resolves it
        self.files = Path(tempfile.mkdtemp(prefix="intellect-gpu-bench-"))
        self.step_s: dict[tuple[str, int], float] = {}  # (model, batch) -> decode seconds a step
        self.val_per_gen = 0.25  # validation time / generation time, until measured
        self.counter = 0

    def save(self) -> None:
        self.report.meta["elapsed_s"] = round(time.perf_counter() - started, 1)
        write(self.report, self.out)

    def generation_s(self, name: str, tokens: int, batch: int) -> float:
        """Predicted seconds of one generation run, from the decode steps measured so far (longer rows
        make steps slower: attention over a longer cache, hence the 1.3)."""
        known = self.step_s.get((name, batch)) or max(
            (s for (m, _), s in self.step_s.items() if m == name), default=0.05
        )
        return 1.3 * tokens * known

    def fits(self, what: str, need: float) -> bool:
        left = self.budget.left()
        if need <= left:
            log(f"{what}: ~{need:.0f} s")
            return True
        log(f"{what}: skipped, needs ~{need:.0f} s and {max(left, 0):.0f} s of the budget are left")
        return False

    def backend(self, model: Qwen2ForCausalLM) -> TorchBackend:
        return TorchBackend(model, -1, self.tokenizer.pad_token_id)  # EOS -1: every row decodes it all

    def generate(self, job: Job, proofs: bool) -> tuple[float, Any]:
        c = job.cell
        return timed(self.device, lambda: make_rollouts(
            self.backend(job.model), self.tokenizer, self.records, job.plan, step=STEP,
            max_new_tokens=c.tokens, temperature=1.0, length_penalty=3e-4, with_proofs=proofs))  # fmt: skip

    def warm_up(self, name: str, model: Qwen2ForCausalLM, batch: int) -> None:
        """CUDA context, cuBLAS handles, SDPA kernels: paid once per model, never inside a cell."""
        backend, prompts, seeds = self.backend(model), [[5, 6, 7, 8]] * batch, list(range(batch))
        backend.generate(prompts, seeds, max_new_tokens=4, temperature=1.0)
        seconds, _ = timed(self.device, lambda: backend.generate(prompts, seeds, max_new_tokens=32,
                                                                temperature=1.0))  # fmt: skip
        self.step_s[(name, batch)] = seconds / 32
        log(f"{name}: warm; {1000 * seconds / 32:.1f} ms a decode step at batch {batch}")

    def core(self, name: str, model: Qwen2ForCausalLM, tokens: int, batch: int) -> Job | None:
        """Generation with proofs as the workload runs it, the file, and its validation: every figure
        but the plain generation run (`plain`, done later as the budget allows)."""
        params_m = sum(p.numel() for p in model.parameters()) / 1e6
        cell = Cell(model=name, params_m=params_m, tokens=tokens, batch=batch)
        self.report.cells.append(cell)
        need = self.generation_s(name, tokens, batch) * (1 + self.val_per_gen) + 2
        if not self.fits(f"{name} {tokens} tokens x batch {batch}", need):
            cell.note = f"skipped: needs ~{need:.0f} s, {max(self.budget.left(), 0):.0f} s of the budget left"
            return None
        self.counter += 1
        plan = plan_batch(NODE, self.counter, len(self.records), batch // GROUP, GROUP, [8])
        job = Job(model, cell, plan)
        try:
            self.measure(job)
        except Exception as exc:  # noqa: BLE001 - out of memory, a bug: reported in the cell, next one runs
            traceback.print_exc()
            cell.note = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        return job

    def measure(self, job: Job) -> None:
        cell, model = job.cell, job.model
        name, tokens, batch = cell.model, cell.tokens, cell.batch
        proofs_s, (rows, timings) = self.generate(job, proofs=True)
        n = sum(len(r.output_tokens) for r in rows)
        self.step_s[(name, batch)] = proofs_s / tokens
        path = self.files / f"{name}-{tokens}-{batch}.parquet"
        info = BatchInfo(node_address=NODE, step=STEP, batch_counter=self.counter, group_size=GROUP,
                         max_new_tokens=tokens, model=name, checkpoint_step=0,
                         device=self.device.type)  # fmt: skip
        write_rollouts(path, rows, info)
        judged = self.judge(path, model, self.label, tokens)
        self.val_per_gen = judged.seconds / proofs_s
        cell.decode_ms_per_step = 1000 * proofs_s / tokens
        cell.gen_proofs_tok_s, cell.proof_build_s = n / proofs_s, timings.proofs
        cell.val_tok_s = n / judged.seconds
        cell.ratio = cell.val_tok_s / cell.gen_proofs_tok_s
        cell.verdict = verdict(judged)
        log(f"  generation with proofs {cell.gen_proofs_tok_s:,.0f} tok/s (proofs built in "
            f"{timings.proofs:.2f} s), validation {cell.val_tok_s:,.0f} tok/s ({cell.ratio:.1f}x), "
            f"{cell.verdict}")  # fmt: skip

    def plain(self, job: Job) -> None:
        """The same generation without hidden-state capture or proofs: the proofs' overhead."""
        c = job.cell
        if not self.fits(f"{c.model} {c.tokens} x {c.batch} without proofs",
                         self.generation_s(c.model, c.tokens, c.batch) + 1):  # fmt: skip
            return
        plain_s, (rows, _) = self.generate(job, proofs=False)
        assert c.gen_proofs_tok_s is not None
        n = sum(len(r.output_tokens) for r in rows)
        proofs_s = n / c.gen_proofs_tok_s
        c.decode_ms_per_step = 1000 * plain_s / c.tokens
        c.gen_tok_s = n / plain_s
        c.proof_overhead_pct = 100 * (proofs_s - plain_s) / plain_s
        log(f"  without proofs {c.gen_tok_s:,.0f} tok/s: proofs cost {c.proof_overhead_pct:+.1f} %")

    def judge(self, path: Path, model: Qwen2ForCausalLM, label: str, tokens: int) -> Judged:
        """The validator's check 8 on a file read back as a validator reads it (the task's length)."""
        rows, _ = read_rollouts(path)
        seconds, (findings, stats) = timed(next(model.parameters()).device, lambda: recompute(
            model, rows, eos_token_id=-1, pad_token_id=int(self.tokenizer.pad_token_id),
            max_new_tokens=tokens, th=self.thresholds))  # fmt: skip
        judged = Judged(file=path.name, device=label, rows=len(rows),
                        tokens=sum(len(r.output_tokens) for r in rows), seconds=seconds,
                        reasons=[f.reason for f in findings],
                        stats=stats.model_dump())  # fmt: skip
        self.report.judged.append(judged)
        return judged

    def breakdown(self, cell: Cell, model: Qwen2ForCausalLM) -> None:
        """Where one validation's time goes (prefill, token checks, TOPLOC), measured once per model."""
        rows, _ = read_rollouts(self.files / f"{cell.model}-{cell.tokens}-{cell.batch}.parquet")
        prompts, outputs = [r.input_tokens for r in rows], [r.output_tokens for r in rows]
        prefill_s, result = timed(self.device, lambda: prefill_batch(model, prompts, outputs, 1.0, 0))
        checks_s, _ = timed(self.device, lambda: token_checks(rows, result))
        toploc_s, _ = timed(self.device, lambda: verify_proofs_batch([p.hidden for p in result],
                                                                     [r.proofs for r in rows]))  # fmt: skip
        cell.breakdown = {"prefill_s": prefill_s, "token_checks_s": checks_s, "toploc_s": toploc_s}
        log(f"  validation breakdown: prefill {prefill_s:.2f} s, token checks {checks_s:.2f} s, "
            f"TOPLOC {toploc_s:.2f} s")  # fmt: skip

    def cpu_check(self, name: str, model: Qwen2ForCausalLM, tokens: int, batch: int) -> None:
        """The same file judged by a CPU copy of the weights, as a CPU validator would judge it."""
        path = self.files / f"{name}-{tokens}-{batch}.parquet"
        if not path.exists():
            self.report.notes.append(f"CPU recompute not run: {path.name} was not made")
            return
        n = batch * tokens
        vocab = SHAPES[name][5]
        # numpy's Gumbel hash (~50 ns an entry on one core) dominates the CPU's share at this vocabulary.
        need = n * vocab * 60e-9 + n * 2 * sum(p.numel() for p in model.parameters()) / 3e11 + 5
        if need > self.budget.left():
            self.report.notes.append(f"CPU recompute skipped: needs ~{need:.0f} s, "
                                     f"{max(self.budget.left(), 0):.0f} s of the budget left")  # fmt: skip
            return
        fp32 = prefill_in_fp32(torch.device("cpu"))
        log(f"CPU recompute of {path.name} (~{need:.0f} s; linear layers through fp32 GEMM: {fp32})")
        cpu_model = copy.deepcopy(model).to("cpu")  # type: ignore[arg-type]
        judged = self.judge(path, cpu_model, "cpu" if self.device.type != "cpu" else "cpu-copy", tokens)
        del cpu_model
        log(f"  CPU: {judged.tokens / judged.seconds:,.0f} tok/s, {verdict(judged)}")
        self.report.notes.append(f"CPU recompute of {path.name}: {judged.seconds:.2f} s, "
                                 f"{judged.tokens / judged.seconds:,.0f} tok/s ({os.cpu_count()} cores)")

    def noise_parity(self, vocab: int) -> None:
        """The Gumbel noise drawn where the logits are equals numpy's (what a CPU validator replays),
        and its cost there. On the CPU the torch hash (the GPU's code) is compared with numpy's."""
        rng = np.random.default_rng(1)
        seeds, positions = rng.integers(0, 2**63 - 1, 16).tolist(), rng.integers(0, 4096, 16).tolist()

        def draw(s: list[int], p: list[int]) -> torch.Tensor:
            return sampler._noise_on_device(s, p, vocab, self.device)

        differ = int((draw(seeds, positions).cpu() != sampler.noise_matrix(seeds, positions, vocab)).sum())
        rows = max(1, (1 << (25 if self.device.type == "cuda" else 20)) // vocab)
        big = (rng.integers(0, 2**63 - 1, rows).tolist(), list(range(rows)))
        draw(*big)
        seconds, _ = timed(self.device, lambda: draw(*big))
        ns = 1e9 * seconds / (rows * vocab)
        self.report.meta["noise"] = {"entries_compared": 16 * vocab, "differing": differ, "ns_per_entry": ns}
        log(f"Gumbel noise (torch hash) on {self.device}: {differ} of {16 * vocab:,} entries differ from "
            f"numpy's; {ns:.2f} ns an entry")  # fmt: skip
        self.report.notes.append(f"Gumbel noise, torch hash on {self.device} vs numpy: {differ} of "
                                 f"{16 * vocab:,} entries differ; the hash costs {ns:.2f} ns an entry there")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="toy sizes on the CPU (under a minute)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N (default auto; --quick: cpu)")
    parser.add_argument("--models", default=None, help="comma-separated: qwen2-0.5b,qwen2-1.5b (or toy)")
    parser.add_argument("--tokens", default=None, help="output lengths, comma-separated (default 256,1024)")
    parser.add_argument("--batch", default=None, help="batch sizes, comma-separated (default 16,64)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 400)")
    parser.add_argument("--no-cpu-check", action="store_true", help="skip the CPU recompute of one file")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_bench.json/.md ($OUT)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.models = (args.models or ("toy" if quick else "qwen2-0.5b,qwen2-1.5b")).split(",")
    tokens = [int(t) for t in (args.tokens or ("32,64" if quick else "256,1024")).split(",")]
    batches = [int(b) for b in (args.batch or ("4,8" if quick else "16,64")).split(",")]
    args.budget = args.budget or (50.0 if quick else 400.0)
    unknown = [m for m in args.models if m not in SHAPES]
    if unknown or any(b % GROUP for b in batches):
        parser.error(f"models are {', '.join(SHAPES)}; batch sizes must be multiples of {GROUP}")
    device = resolve_device(args.device or ("cpu" if quick else "auto"))
    out = args.out or Path(os.environ.get("OUT") or HERE.parent / "out" / "gpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    meta: dict[str, Any] = {
        "mode": "quick" if quick else "full", "device": str(device), "device_name": name,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
        "budget_s": args.budget, "vocab": sorted({SHAPES[m][5] for m in args.models}), "group": GROUP,
        "attention": ATTENTION, "argv": sys.argv[1:],
    }  # fmt: skip
    report = Report(meta=meta)
    bench = Bench(args, device, report, out)
    log(f"device {meta['device_name']}, models {args.models}, tokens {tokens}, batches {batches}, "
        f"budget {args.budget:.0f} s, files in {bench.files}, report to {out}")  # fmt: skip
    cpu_check = (args.models[0], tokens[0], batches[0])  # by default the 0.5B's 256 tokens x 16 rows
    try:
        bench.noise_parity(max(SHAPES[m][5] for m in args.models))
        run_all(bench, tokens, batches, cpu_check)
    except KeyboardInterrupt:
        report.notes.append("interrupted (time limit): the figures above are what was measured")
        log("interrupted: writing what was measured")
    finally:
        bench.save()
        print("\n" + markdown(report), flush=True)
        log(f"wrote gpu_bench.json and gpu_bench.md to {out}")
    return 0


def guarded(bench: Bench, cell: Cell | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, one step of the bench; a failure (out of memory, a bug) is reported in the cell
    or the notes, and the next step runs."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        message = f"{what} failed: {type(exc).__name__}: {str(exc)[:120]}"
        if cell is not None:
            cell.note = (cell.note + "; " if cell.note else "") + message
        else:
            bench.report.notes.append(message)
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
        return None
    finally:
        bench.save()


def run_all(bench: Bench, tokens: list[int], batches: list[int], cpu_check: tuple[str, int, int]) -> None:
    """Most important first, so that a short budget loses the least: (1) generation with proofs and
    validation of every cell, shortest outputs first, over both models (they are small next to the
    GPU's memory, so both stay loaded); the CPU recompute of one file right after it is made; (2) the
    runs without proofs (the proofs' overhead), cheapest first; (3) where validation time goes."""
    models = {}
    for name in bench.args.models:
        log(f"building {name} on {bench.device}")
        models[name] = build_model(name, bench.device)
        bench.report.meta.setdefault("attention_used", {})[name] = models[name].config._attn_implementation
        bench.warm_up(name, models[name], max(batches))
    jobs = []
    for t in tokens:
        for name, model in models.items():
            for b in batches:
                job = guarded(bench, None, f"{name} {t} x {b}", bench.core, name, model, t, b)
                if job is not None:
                    jobs.append(job)
                if (name, t, b) == cpu_check and job is not None and not bench.args.no_cpu_check:
                    guarded(bench, None, "CPU recompute", bench.cpu_check, name, model, t, b)
    for job in sorted(jobs, key=lambda j: j.cell.tokens * j.cell.batch):
        guarded(bench, job.cell, "run without proofs", bench.plain, job)
    for name, model in models.items():
        done = [j.cell for j in jobs if j.cell.model == name and j.cell.val_tok_s]
        if done:
            largest = max(done, key=lambda c: c.tokens * c.batch)
            assert largest.val_tok_s is not None
            need = 3 * largest.tokens * largest.batch / largest.val_tok_s
            if bench.fits(f"{name}: validation breakdown", need):
                guarded(bench, largest, "breakdown", bench.breakdown, largest, model)


if __name__ == "__main__":
    sys.exit(main())
