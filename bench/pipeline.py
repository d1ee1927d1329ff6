"""Pipeline groups side by side with one node, in one run: tokens/s, activation bytes on the wire per
generated token, proof overhead per stage, and the validator's cost of accepting a group's batch (one
prefill) vs blaming a member (the same prefill, every stage's proofs replayed).

Members are real processes on loopback (CURVE-encrypted ZeroMQ), one torch thread each; one node is
`TorchBackend` in this process with one thread, so every member and the node run at the same
per-process speed. On one machine a group cannot be faster than a node (its members share the CPU and
wait on each other: a pipeline of one batch runs its stages one after another); what the figures show
is what splitting costs, in time and bytes, for a model one machine could not hold.

    .venv/bin/python bench/pipeline.py                     # tiny (4 layers) and small (512 x 8 layers)
    .venv/bin/python bench/pipeline.py --size tiny --rows 8 --tokens 64 --json
    .venv/bin/python bench/pipeline.py --size tiny --delays 10,50,100   # groups over slow hops

Over slow hops (`--delays`, and loopback) each group runs naive (one batch at a time) and with
`--in-flight` batches moving at once (workloads/pipeline/flight.py), side by side.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from intellect.links import LinkShape  # noqa: E402
from workloads.datasets import load_dataset  # noqa: E402
from workloads.inference.generate import proofs_for  # noqa: E402
from workloads.model.backends import TorchBackend  # noqa: E402
from workloads.model.loading import TINY_MODEL_DIR, load_model, load_tokenizer  # noqa: E402
from workloads.pipeline.group import run_local_group  # noqa: E402
from workloads.pipeline.judge.end_to_end import GroupRows, judge_group  # noqa: E402
from workloads.pipeline.member import BatchRequest  # noqa: E402
from workloads.pipeline.stages import plan_stages  # noqa: E402


def small_model(folder: Path) -> Path:
    """A seeded random-weight Qwen2 of 512 x 8 layers with the tiny tokenizer, saved as a model folder."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=99, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_MODEL_DIR / name, folder / name)
    return folder


def measure(model_dir: str, label: str, rows: int, tokens: int, work: Path, delays: list[float],
            batches: int, in_flight: int) -> dict:  # fmt: skip
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir)
    eos = -1  # fixed-length outputs: every row decodes `tokens` tokens
    records = load_dataset("demo")
    prompts = [tok(records[i % len(records)].prompt)["input_ids"] for i in range(rows)]
    req = BatchRequest(prompts, list(range(rows)), tokens, 1.0)
    torch.set_num_threads(1)
    backend = TorchBackend(model, eos, int(tok.pad_token_id))
    t0 = time.perf_counter()
    one = backend.generate(prompts, req.seeds, max_new_tokens=tokens, temperature=1.0)
    t1 = time.perf_counter()
    proofs_for(one)
    t2 = time.perf_counter()
    produced = sum(len(c.tokens) for c in one)
    result: dict = {"model": label, "rows": rows, "tokens": tokens, "one_node_tok_s": produced / (t2 - t0),
                    "one_node_proof_share": (t2 - t1) / (t2 - t0)}  # fmt: skip
    torch.set_num_threads(2)
    for members in (2, 3):
        run = run_local_group(members, req, work / f"{label}-{members}", model=model_dir, timeout=120,
                              eos=eos)  # fmt: skip
        if not run.ok:
            raise SystemExit(f"{members}-member group failed: {run.errors}")
        driver = run.outputs[0]
        made = sum(len(t) for t in driver.tokens)
        sent = sum(o.bytes_sent for o in run.outputs.values())
        group = GroupRows(prompts, driver.tokens, run.outputs[members - 1].logprobs, req.seeds,
                          [run.outputs[i].proofs for i in range(members)])  # fmt: skip
        plans = plan_stages(model_dir, members)
        a0 = time.perf_counter()
        accepted = judge_group(model, plans, group, int(tok.pad_token_id))
        a1 = time.perf_counter()
        zeroed = [b"\0" * len(p) for p in group.stage_proofs[-1]]  # the last stage's proofs broken
        broken = GroupRows(group.prompts, group.outputs, group.logprobs, group.seeds,
                           group.stage_proofs[:-1] + [zeroed])  # fmt: skip
        blamed = judge_group(model, plans, broken, int(tok.pad_token_id))
        a2 = time.perf_counter()
        assert accepted.accepted and not blamed.accepted, (accepted, blamed)  # envelopes: tiny-calibrated
        result[f"group{members}"] = {
            "tok_s": made / driver.seconds,
            "vs_one_node": (made / driver.seconds) / result["one_node_tok_s"],
            "wire_bytes_per_token": sent / made,
            "proof_share_per_stage": [round(run.outputs[i].proof_seconds / run.outputs[i].seconds, 4)
                                      for i in range(members)],  # fmt: skip
            "validate_accept_s": a1 - a0,
            "validate_blame_s": a2 - a1,
            "blamed": blamed.blamed,
            "validate_vs_generate": driver.seconds / (a1 - a0),
        }
        result[f"group{members}"]["links"] = over_links(model_dir, label, members, prompts, tokens, eos, work,
                                                        [0.0, *delays], batches, in_flight)  # fmt: skip
    result["acceptance"] = acceptance(model_dir, rows, tokens)
    return result


DRAFT_TOKENS = 4
DRAFT = "model:tiny"  # the shipped tiny model as the draft: of the tiny target itself (its ceiling), of small


def acceptance(model_dir: str, rows: int, tokens: int) -> dict:
    """Exact speculative decoding's acceptance by task and draft: steps per trip round the ring (a batch
    advances in step, so a trip keeps the drafted tokens every row would have drawn), batches of one row
    and of `rows`, on each shipped task's prompts, real end of sequence; a 2-member group of threads."""
    from workloads.pipeline.draft import make_draft
    from workloads.pipeline.group import run_thread_group

    tok = load_tokenizer(model_dir)
    drafts = {name: make_draft(name) for name in ("prompt-lookup", DRAFT)}
    out: dict = {}
    for task in ("reverse", "demo", "math", "code"):
        records = load_dataset(task)
        prompts = [tok(records[i % len(records)].prompt)["input_ids"] for i in range(rows)]
        for name, draft in drafts.items():
            for batch_rows in (1, rows):
                requests = [BatchRequest(prompts[i : i + batch_rows], list(range(i, i + batch_rows)), tokens,
                                         1.0) for i in range(0, rows, batch_rows)]  # fmt: skip
                run = run_thread_group(2, requests, model=model_dir, draft=draft, draft_tokens=DRAFT_TOKENS)
                if not run.ok:
                    raise SystemExit(f"acceptance on {task} with {name}: {run.errors}")
                driver = [b[0] for b in run.batches]
                steps = sum(max(map(len, o.tokens)) for o in driver)
                out.setdefault(task, {})[f"{name} rows {batch_rows}"] = steps / sum(o.trips for o in driver)
    return out


def over_links(model_dir: str, label: str, members: int, prompts: list, tokens: int, eos: int, work: Path,
               delays: list[float], batches: int, in_flight: int) -> dict:  # fmt: skip
    """The group with every hop held `d` ms one way by a delay relay (intellect/links.py), naive (one
    batch at a time) and with `in_flight` batches moving at once: tokens/s over the whole run, from the
    first batch's start to the last one's end at the driver. The naive group runs 2 of the batches (it
    makes them one after another, so more would only take longer), the flying group all of them."""
    rows = len(prompts)
    requests = [BatchRequest(prompts, [b * rows + r for r in range(rows)], tokens, 1.0, batch=b + 1)
                for b in range(batches)]  # fmt: skip
    cells: dict = {}
    for d in delays:
        cell: dict = {}
        modes = (("naive", 1, requests[:2], "none"), ("naive_draft", 1, requests[:2], DRAFT),
                 ("flight", in_flight, requests, "none"),
                 ("flight_draft", in_flight, requests, DRAFT))  # fmt: skip
        for mode, k, some, draft in modes:
            run = run_local_group(members, some, work / f"{label}-{members}-{d:g}ms-{mode}", model=model_dir,
                                  timeout=120 + 4 * tokens * members * d / 1000, eos=eos, in_flight=k,
                                  link=LinkShape(d / 1000) if d else None, draft=draft,
                                  draft_tokens=DRAFT_TOKENS)  # fmt: skip
            if not run.ok:
                raise SystemExit(f"{members}-member {mode} group at {d:g} ms failed: {run.errors}")
            driver = [b[0] for b in run.batches]
            made = sum(len(t) for out in driver for t in out.tokens)
            wall = max(o.started + o.seconds for o in driver) - min(o.started for o in driver)
            sent = sum(o.bytes_sent for b in run.batches for o in b.values())
            steps = sum(max(map(len, o.tokens)) for o in driver)
            cell[mode] = {"tok_s": made / wall, "batches": len(some), "in_flight": k, "draft": draft,
                          "wire_bytes_per_token": sent / made,
                          "steps_per_trip": steps / sum(o.trips for o in driver),
                          "tokens": [o.tokens for o in driver]}  # fmt: skip
        if not (cell["flight"]["tokens"][:2] == cell["flight_draft"]["tokens"][:2] == cell["naive"]["tokens"]
                == cell["naive_draft"]["tokens"]):  # fmt: skip
            raise SystemExit(f"{members}-member group at {d:g} ms: in flight or drafted it drew other tokens")
        for mode in cell.values():
            del mode["tokens"]
        cells[f"{d:g}"] = cell
    loopback = cells["0"]["naive"]["tok_s"]
    for cell in cells.values():
        for mode in cell.values():
            mode["vs_loopback_naive"] = mode["tok_s"] / loopback
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", action="append", choices=["tiny", "small"], help="model (repeat)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--delays", default="", help="one-way ms per hop to run the groups at too, e.g. "
                        "10,50,100 (a delay relay on every hop)")
    parser.add_argument("--batches", type=int, default=16, help="batches per run over the links (default 16)")
    parser.add_argument("--in-flight", type=int, default=16, help="batches moving at once (default 16)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for size in args.size or ["tiny", "small"]:
            model_dir = str(TINY_MODEL_DIR) if size == "tiny" else str(small_model(work / "small"))
            results.append(measure(model_dir, size, args.rows, args.tokens, work, delays, args.batches,
                                   args.in_flight))  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'model':6s} {'members':>7s} {'tok/s':>8s} {'vs 1 node':>9s} {'wire B/token':>12s} "
          f"{'proof share per stage':>24s} {'accept s':>8s} {'blame s':>8s} {'gen/accept':>10s}")  # fmt: skip
    for r in results:
        print(f"{r['model']:6s} {1:>7d} {r['one_node_tok_s']:>8.0f} {1.0:>8.2f}× {0:>12d} "
              f"{r['one_node_proof_share'] * 100:>23.1f}% {'':>8s} {'':>8s} {'':>10s}")  # fmt: skip
        for members in (2, 3):
            g = r[f"group{members}"]
            shares = " / ".join(f"{s * 100:.1f}%" for s in g["proof_share_per_stage"])
            print(f"{r['model']:6s} {members:>7d} {g['tok_s']:>8.0f} {g['vs_one_node']:>8.2f}× "
                  f"{g['wire_bytes_per_token']:>12.0f} {shares:>24s} {g['validate_accept_s']:>8.3f} "
                  f"{g['validate_blame_s']:>8.3f} {g['validate_vs_generate']:>9.1f}×")  # fmt: skip
    print(f"\ngroups over delayed hops (one way, every hop), {args.batches} batches of {args.rows} rows x "
          f"{args.tokens} tokens (naive: 2 of them); tok/s (share of the naive group on loopback); in "
          f"flight: {args.in_flight} batches; draft: {DRAFT}, {DRAFT_TOKENS} tokens a trip")  # fmt: skip
    modes = ("naive", "naive_draft", "flight", "flight_draft")
    print(f"{'model':6s} {'members':>7s} {'ms/hop':>6s} " + " ".join(f"{m:>15s}" for m in modes)
          + f" {'steps/trip':>10s} {'B/token':>8s}")  # fmt: skip
    for r in results:
        for members in (2, 3):
            for d, cell in r[f"group{members}"]["links"].items():
                cells = " ".join(f"{cell[m]['tok_s']:>7.0f} ({cell[m]['vs_loopback_naive']:.2f}×)"
                                 for m in modes)  # fmt: skip
                print(f"{r['model']:6s} {members:>7d} {d:>6s} {cells} "
                      f"{cell['flight_draft']['steps_per_trip']:>10.2f} "
                      f"{cell['flight']['wire_bytes_per_token']:>8.0f}")  # fmt: skip
    print("\nsteps per trip round the ring, by task and draft (real end of sequence)")
    for r in results:
        for task, per in r["acceptance"].items():
            print(f"{r['model']:6s} {task:8s} " + "  ".join(f"{k}: {v:.2f}" for k, v in per.items()))


if __name__ == "__main__":
    main()
