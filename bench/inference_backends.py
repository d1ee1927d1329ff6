"""The two generating backends side by side: the project's torch decoder and vLLM's V1 engine (issue 57),
on the same plan, model and machine.

    .venv/bin/python bench/inference_backends.py                          # tiny, 16 rows x 128 tokens
    .venv/bin/python bench/inference_backends.py --model small --tokens 64 --json

Each backend runs in a process of its own, in its own environment (torch: this one; vLLM: .venv-vllm,
`make vllm`), and reports:
- start-up: from nothing to ready (torch: the model loaded; vLLM: its engine started: model, KV cache,
  warm-up), once per process (the workload keeps it for every batch);
- tokens/s plain (no hidden states kept, no proofs) and with proofs (hidden states captured while
  decoding, TOPLOC proofs built after it, as the workload does); the minimum of --repeats runs;
- proof overhead = (with proofs - plain) / plain, of decode wall time and of the process's CPU time
  (every thread of it, not what other processes took: steadier on a shared machine); issue 57's goal:
  <= 5 %.
Then here, as a validator: the files recomputed as the validator's judge does
(`workloads.inference.judge.checks.model.recompute`, the torch prefill and every check, under the limits
the validator resolves for the model and the backend that made the file), validation tokens/s, and its
ratio to the generation tokens/s with proofs.
Every row decodes exactly --tokens tokens (EOS off). The machine is shared: figures are minima.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import make_rollouts  # noqa: E402
from workloads.inference.selection import plan_batch  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer, resolve  # noqa: E402
from workloads.model.shapes import build_model_dir  # noqa: E402
from workloads.rollouts import BatchInfo, read_rollouts, write_rollouts  # noqa: E402

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


def model_path(name: str) -> str:
    return resolve("tiny") if name == "tiny" else str(build_model_dir(name, ROOT / "bench/out/models"))


def child(backend: str, model: str, batch: int, tokens: int, repeats: int, out: Path) -> dict:
    """One backend's generation figures (runs in that backend's environment)."""
    tok = load_tokenizer(model)
    started = time.perf_counter()
    if backend == "vllm":
        from workloads.model.vllm_backend import VLLMBackend

        engine = VLLMBackend(model, eos_token_id=-1)  # EOS -1: every row decodes `tokens`
    else:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        from workloads.model.backends import TorchBackend

        engine = TorchBackend(load_model(model), -1, tok.pad_token_id)  # type: ignore[assignment]
    startup = time.perf_counter() - started
    records = load_dataset("demo")
    plan = plan_batch(NODE, 1, len(records), batch, 1, [8])
    kw = dict(step=0, max_new_tokens=tokens, temperature=1.0, length_penalty=3e-4)
    make_rollouts(engine, tok, records, plan, with_proofs=True, **kw)  # warm-up
    plain, proved, plain_cpu, proved_cpu = [], [], [], []
    for _ in range(repeats):  # interleaved: a load that comes and goes hits both alike
        t0, c0 = time.perf_counter(), time.process_time()
        make_rollouts(engine, tok, records, plan, with_proofs=False, **kw)
        plain.append(time.perf_counter() - t0)
        plain_cpu.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        rows, _ = make_rollouts(engine, tok, records, plan, with_proofs=True, **kw)
        proved.append(time.perf_counter() - t0)
        proved_cpu.append(time.process_time() - c0)
    info = BatchInfo(node_address=NODE, step=0, batch_counter=1, group_size=1, max_new_tokens=tokens)
    write_rollouts(out, rows, info)
    n = sum(len(r.output_tokens) for r in rows)
    p, q, pc, qc = min(plain), min(proved), min(plain_cpu), min(proved_cpu)
    return {"backend": backend, "startup_s": startup, "output_tokens": n, "tok_s_plain": n / p,
            "tok_s_proofs": n / q, "overhead_pct": 100 * (q - p) / p,
            "overhead_cpu_pct": 100 * (qc - pc) / pc, "plain_s": p, "proofs_s": q}  # fmt: skip


def run_backend(backend: str, model: str, batch: int, tokens: int, repeats: int, work: Path) -> dict:
    """`child` in a process of the backend's environment, then the validator's recomputation here."""
    from workloads.inference.judge.calibration import resolve_limits
    from workloads.inference.judge.checks.model import recompute
    from workloads.model.vllm_backend import vllm_python

    python = vllm_python() if backend == "vllm" else sys.executable
    out = work / f"{backend}.parquet"
    done = subprocess.run([python, __file__, "--child", backend, "--model", model, "--batch", str(batch),
                           "--tokens", str(tokens), "--repeats", str(repeats), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{backend} child failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    rows, _ = read_rollouts(out)
    validator = load_model(model)
    th = resolve_limits(model, {"prefill_batch_size": batch}, backend=backend).thresholds
    pad = int(load_tokenizer(model).pad_token_id)
    verify = []
    for _ in range(repeats):  # every check a validator runs; the verdicts are the judge's (not here)
        t0 = time.perf_counter()
        recompute(validator, rows, eos_token_id=-1, pad_token_id=pad, max_new_tokens=tokens, th=th)
        verify.append(time.perf_counter() - t0)
    figures["validate_tok_s"] = figures["output_tokens"] / min(verify)
    figures["validate_over_generate"] = figures["validate_tok_s"] / figures["tok_s_proofs"]
    return figures


def main(
    model: str = typer.Option("tiny", help="tiny (shipped) or a shape of workloads/model/shapes.py"),
    batch: int = typer.Option(16, min=1, help="sequences per batch"),
    tokens: int = typer.Option(128, min=2, help="decoded tokens per sequence"),
    repeats: int = typer.Option(3, min=1, help="timed repetitions (minimum reported)"),
    as_json: bool = typer.Option(False, "--json"),
    child_backend: str = typer.Option("", "--child", hidden=True),
    out: Path = typer.Option(Path("rows.parquet"), "--out", hidden=True),
) -> None:
    if child_backend:
        print(json.dumps(child(child_backend, model, batch, tokens, repeats, out)))
        return
    path = model_path(model)
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as work:
        rows = [run_backend(b, path, batch, tokens, repeats, Path(work)) for b in ("torch", "vllm")]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title=f"{model}: {batch} rows x {tokens} tokens, {os.cpu_count()} cores, "
                        f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    for col in ("backend", "start-up s", "tok/s plain", "tok/s proofs", "proof overhead wall / CPU",
                "validate tok/s", "validate / generate"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        overhead = f"{r['overhead_pct']:+.1f} % / {r['overhead_cpu_pct']:+.1f} %"
        table.add_row(r["backend"], f"{r['startup_s']:.1f}", f"{r['tok_s_plain']:.0f}",
                      f"{r['tok_s_proofs']:.0f}", overhead, f"{r['validate_tok_s']:.0f}",
                      f"{r['validate_over_generate']:.1f}x")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    typer.run(main)
