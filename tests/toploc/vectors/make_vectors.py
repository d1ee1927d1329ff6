"""Regenerate the known-answer vectors with the REFERENCE toploc library (not ours).

Needs toploc 0.1.6 built from source into the venv (see docs/toploc.md, "Reference library"):
    .venv/bin/python tests/toploc/vectors/make_vectors.py
Writes activations.safetensors (bf16 tensors) and expected.json (the reference's proof bytes as
hex and its verification results for identical, perturbed and unrelated activations).
"""

from __future__ import annotations

import json
from pathlib import Path

import toploc
import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)


def cases() -> dict[str, dict]:
    """name -> {tensors, how the reference is called}; every activation is bf16."""
    out: dict[str, dict] = {}

    g = torch.Generator().manual_seed(1)
    # A decode-only sample as prime-rl passes it: one 2-D tensor, a final partial chunk of 8.
    out["decode_896"] = {"tensor": randn(g, 40, 896, scale=3.0), "dbs": 32, "topk": 128}

    g = torch.Generator().manual_seed(2)
    # Many ties at the top-k boundary (integer-valued activations).
    out["ties_128"] = {
        "tensor": torch.randint(-12, 13, (64, 128), generator=g).to(torch.bfloat16),
        "dbs": 32,
        "topk": 128,
    }

    g = torch.Generator().manual_seed(3)
    # NaN, -NaN and +-inf among the activations, and a whole row of NaN.
    t = randn(g, 48, 160)
    t[2, 7], t[5, 9], t[6, 1], t[40] = float("nan"), float("inf"), -float("inf"), float("nan")
    t[9, 3] = -float("nan")
    out["nonfinite_160"] = {"tensor": t, "dbs": 32, "topk": 128}

    g = torch.Generator().manual_seed(4)
    # A chunk wider than the field prime whose top indices collide mod 65497 (index 100 and
    # 100 + 65497 are both large): the modulus search must step below 65497.
    t = randn(g, 32, 2100, scale=0.1)
    flat = t.view(-1)
    flat[100], flat[100 + 65497], flat[7 + 2 * 65497 // 3] = 50.0, -60.0, 70.0
    out["collide_2100"] = {"tensor": t, "dbs": 32, "topk": 128}

    g = torch.Generator().manual_seed(5)
    # The list form with a prefill first (skip_prefill=False), decode batches of 16, topk 64.
    out["prefill_list_256"] = {
        "prefill": randn(g, 5, 256),
        "decode": randn(g, 40, 256),
        "dbs": 16,
        "topk": 64,
    }
    return out


def call_args(case: dict, tensor_key: str, tensors: dict) -> tuple[object, bool]:
    """(activations, skip_prefill) in the form the reference is called with."""
    if "prefill" in case:
        decode = tensors[f"{tensor_key}.decode"]
        return [tensors[f"{tensor_key}.prefill"]] + [row for row in decode], False
    return tensors[tensor_key], True


def results(rs) -> list[list[float]]:
    return [[r.exp_mismatches, r.mant_err_mean, r.mant_err_median] for r in rs]


def main() -> None:
    tensors: dict[str, torch.Tensor] = {}
    expected: dict[str, dict] = {
        "reference": f"toploc {getattr(toploc, '__version__', '?')} (0.1.6 sdist)",
        "cases": {},
    }
    for seed, (name, case) in enumerate(cases().items()):
        g = torch.Generator().manual_seed(100 + seed)
        parts = (
            {"prefill": case["prefill"], "decode": case["decode"]}
            if "prefill" in case
            else {"": case["tensor"]}
        )
        for part, t in parts.items():
            suffix = f".{part}" if part else ""
            tensors[f"{name}.identical{suffix}"] = t.contiguous()
            noise = torch.randn(t.shape, generator=g) * 0.01 * t.float().abs().nan_to_num(0).clamp(max=1e3)
            tensors[f"{name}.perturbed{suffix}"] = (t.float() + noise).to(torch.bfloat16).contiguous()
            tensors[f"{name}.unrelated{suffix}"] = randn(
                g, *t.shape, scale=float(t.float().nan_to_num(0, 0, 0).std())
            ).contiguous()
        acts, skip = call_args(case, f"{name}.identical", tensors)
        proofs = toploc.build_proofs_bytes(acts, case["dbs"], case["topk"], skip_prefill=skip)
        verdicts = {}
        for variant in ("identical", "perturbed", "unrelated"):
            acts_v, _ = call_args(case, f"{name}.{variant}", tensors)
            verdicts[variant] = results(
                toploc.verify_proofs_bytes(acts_v, proofs, case["dbs"], case["topk"], skip_prefill=skip)
            )
        expected["cases"][name] = {
            "decode_batching_size": case["dbs"],
            "topk": case["topk"],
            "skip_prefill": skip,
            "form": "list" if "prefill" in case else "tensor",
            "proofs": [p.hex() for p in proofs],
            "verify": verdicts,
        }
    save_file(tensors, str(HERE / "activations.safetensors"))
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {len(tensors)} tensors and {len(expected['cases'])} cases to {HERE}")


if __name__ == "__main__":
    main()
