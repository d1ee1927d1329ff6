"""Inference bench: tokens/s with and without TOPLOC proofs, and verification vs generation time.

    .venv/bin/python bench/inference.py [--batch 32] [--tokens 64] [--repeats 3] [--json]

Two workloads on the shipped tiny model (bf16, CPU):
- "full": EOS disabled, every sequence decodes --tokens tokens (full 32-token proof chunks);
- "demo": the real demo tasks, sequences stop at EOS (3-8 tokens: one partial chunk each).
Proof overhead = extra generation time with hidden-state capture + proof building (a difference of
two timings, noisy on a shared machine); "proof build / gen" = proof building time alone over plain
generation time. Verification =
one batched prefill over prompt + output plus every check a validator runs (TOPLOC, sampling
reproduction from the seed, logprobs, termination), timed against generating the same rollouts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import make_rollouts  # noqa: E402
from workloads.inference.selection import plan_batch  # noqa: E402
from workloads.inference.verify import CheckSettings, check_rollouts  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.loading import load_model, load_tokenizer  # noqa: E402
from workloads.model.prefill import prefill_batch  # noqa: E402

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


def run_case(name: str, model, tok, batch: int, tokens: int, repeats: int, stop_at_eos: bool) -> dict:
    records = load_dataset("demo")
    eos = tok.eos_token_id if stop_at_eos else -1  # -1 never matches: fixed-length decoding
    backend = TorchBackend(model, eos, tok.pad_token_id)
    plan = plan_batch(NODE, 1, 1, len(records), batch, 1, [8])
    kw = dict(step=1, max_new_tokens=tokens, temperature=1.0, length_penalty=3e-4)
    make_rollouts(backend, tok, records, plan, with_proofs=True, **kw)  # warm-up
    plain, proved, proof_part, verify, prefill_only = [], [], [], [], []
    for _ in range(repeats):  # interleaved, minimum reported: robust to other load on the machine
        t0 = time.perf_counter()
        rows, _ = make_rollouts(backend, tok, records, plan, with_proofs=False, **kw)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rows, timings = make_rollouts(backend, tok, records, plan, with_proofs=True, **kw)
        proved.append(time.perf_counter() - t0)
        proof_part.append(timings.proofs)
        t0 = time.perf_counter()
        results = check_rollouts(
            model,
            rows,
            eos_token_id=eos,
            max_new_tokens=tokens,
            settings=CheckSettings(prefill_batch_size=batch),
        )
        verify.append(time.perf_counter() - t0)
        assert all(r.passed for r in results), [r.reasons for r in results if not r.passed][:3]
        t0 = time.perf_counter()
        prefill_batch(model, [r.input_tokens for r in rows], [r.output_tokens for r in rows])
        prefill_only.append(time.perf_counter() - t0)
    n_tokens = sum(len(r.output_tokens) for r in rows)
    chunks = sum(-(-(len(r.output_tokens) - 1) // 32) for r in rows)
    p, q, v, pf = min(plain), min(proved), min(verify), min(prefill_only)
    return {
        "case": name,
        "sequences": batch,
        "output_tokens": n_tokens,
        "tok_s_plain": n_tokens / p,
        "tok_s_proofs": n_tokens / q,
        "overhead_pct": 100 * (q - p) / p,
        "proof_ms_per_chunk": 1000 * min(proof_part) / max(chunks, 1),
        "proof_s": min(proof_part),
        "proof_share_pct": 100 * min(proof_part) / p,
        "generate_s": q,
        "verify_s": v,
        "verify_speedup": q / v,
        "prefill_s": pf,
        "prefill_speedup": q / pf,
    }


def main(
    batch: int = typer.Option(32, help="sequences per batch"),
    tokens: int = typer.Option(64, help="decoded tokens per sequence in the 'full' case"),
    repeats: int = typer.Option(5, help="timed repetitions (minimum reported)"),
    model_name: str = typer.Option("tiny", "--model", help="model name or path (a real model on a GPU host)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    threads: int = typer.Option(1, help="torch threads (1: stable figures on a shared 2-core machine)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    model, tok = load_model(model_name, device=device), load_tokenizer(model_name)
    rows = [
        run_case("full", model, tok, batch, tokens, repeats, stop_at_eos=False),
        run_case("demo", model, tok, batch, 16, repeats, stop_at_eos=True),
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"inference bench ({model_name}, bf16, {device}, {torch.get_num_threads()} threads)")
    for col in [
        "case",
        "seqs",
        "tokens",
        "tok/s plain",
        "tok/s +proofs",
        "overhead",
        "proof build / gen",
        "proof ms/chunk",
        "generate s",
        "verify s",
        "verify speed-up",
        "prefill s",
        "prefill speed-up",
    ]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["case"],
            str(r["sequences"]),
            str(r["output_tokens"]),
            f"{r['tok_s_plain']:.0f}",
            f"{r['tok_s_proofs']:.0f}",
            f"{r['overhead_pct']:.1f} %",
            f"{r['proof_share_pct']:.1f} %",
            f"{r['proof_ms_per_chunk']:.2f}",
            f"{r['generate_s']:.3f}",
            f"{r['verify_s']:.3f}",
            f"{r['verify_speedup']:.1f}x",
            f"{r['prefill_s']:.3f}",
            f"{r['prefill_speedup']:.1f}x",
        )
    Console(width=200).print(table)


if __name__ == "__main__":
    typer.run(main)
