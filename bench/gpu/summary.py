"""The GPU bench's report: the throughput table, the honest calibration against the validator's
thresholds, and writing both as JSON and markdown. Kept apart from the measuring (bench.py) so
that a partial run (a cell skipped, the run cut short) still reports what it measured."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from validator.checks.model import FileStats, distribution_reasons, pooled
from validator.thresholds import ValidationThresholds


@dataclass
class Cell:
    """One (model, output length, batch) measurement; `note` says why a cell was skipped or failed."""

    model: str
    params_m: float
    tokens: int
    batch: int
    note: str = ""
    decode_ms_per_step: float | None = None
    gen_tok_s: float | None = None  # generation without proofs (no hidden-state capture)
    gen_proofs_tok_s: float | None = None  # with capture and TOPLOC proofs, as the workload runs
    proof_overhead_pct: float | None = None  # wall-clock difference of the two runs
    proof_build_s: float | None = None  # building the proofs after decoding (within the run above)
    val_tok_s: float | None = None  # the validator's recomputation of the file (check 8)
    ratio: float | None = None  # val_tok_s / gen_proofs_tok_s
    verdict: str = ""
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds: prefill, token checks, TOPLOC


@dataclass
class Judged:
    """One honest file recomputed on one device, with the validator's reasons and statistics."""

    file: str
    device: str
    rows: int
    tokens: int
    seconds: float
    reasons: list[str]
    stats: dict[str, Any]


@dataclass
class Report:
    meta: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)
    judged: list[Judged] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def throughput_table(cells: list[Cell]) -> list[str]:
    head = ("| model | params | out tokens | batch | decode ms/step | gen tok/s | gen tok/s + proofs | proof "
            "overhead | proof build s | val tok/s | val / gen | honest file, recomputed there |")  # fmt: skip
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in cells:
        verdict = c.note if c.note else c.verdict
        figures = [
            _f(c.decode_ms_per_step, ".1f"), _f(c.gen_tok_s, ",.0f"), _f(c.gen_proofs_tok_s, ",.0f"),
            _f(c.proof_overhead_pct, "+.1f", " %"), _f(c.proof_build_s, ".3f"), _f(c.val_tok_s, ",.0f"),
            _f(c.ratio, ".1f", "×"),
        ]  # fmt: skip
        params = f"{c.params_m:,.0f} M" if c.params_m >= 10 else f"{c.params_m:.2f} M"
        lines.append(f"| {c.model} | {params} | {c.tokens:,} | {c.batch} | " + " | ".join(figures)
                     + f" | {verdict} |")  # fmt: skip
    return lines


# (label, FileStats field or derived key, shipped limit, reference limit, how the limit applies)
STATISTICS: list[tuple[str, str, str]] = [
    ("per chunk: exponent mismatches (≤)", "max_exp_mismatches", "chunk_max_exp_mismatches"),
    ("per chunk: mantissa error mean (<)", "max_chunk_mean", "chunk_max_mant_mean"),
    ("per chunk: mantissa error median (<)", "max_chunk_median", "chunk_max_mant_median"),
    ("per file: share of chunks with median ≥ 1 (≤)", "median_chunk_share", "file_max_median_chunks"),
    ("per file: mean mantissa error (<)", "mant_mean", "file_max_mant_mean"),
    ("per token: Gumbel score gap (≤)", "max_gap", "sampling_max_gap"),
    ("per token: logprob error (≤)", "max_logprob_error", "logprob_tolerance"),
    ("per file: \\|signed mean logprob error\\| / its limit (≤)", "bias_share", ""),
]


def worst(judged: list[Judged], key: str, th: ValidationThresholds) -> float | None:
    """The worst honest value of one statistic over files (file-level shares only where the validator
    applies them: files with at least `file_min_chunks` chunks)."""
    values = []
    for j in judged:
        s = FileStats.model_validate(j.stats)
        if key in ("median_chunk_share", "mant_mean") and s.chunks < th.file_min_chunks:
            continue
        if key == "bias_share":
            values.append(abs(s.lp_bias) / th.bias_limit(s.lp_tokens) if s.lp_tokens else 0.0)
        else:
            values.append(float(getattr(s, key)))
    return max(values) if values else None


def calibration_table(judged: list[Judged]) -> list[str]:
    shipped, reference = ValidationThresholds(), ValidationThresholds.reference()
    devices = sorted({j.device for j in judged}, key=lambda d: (d != "gpu", d))
    lines = [
        "| statistic | limit (shipped) | limit (reference) | "
        + " | ".join(f"worst honest ({d} recompute)" for d in devices)
        + " | margin to the shipped limit |",
        "|---|---:|---:|" + "---:|" * len(devices) + "---:|",
    ]
    for label, key, limit_name in STATISTICS:
        limit = float(getattr(shipped, limit_name)) if limit_name else 1.0
        ref = float(getattr(reference, limit_name)) if limit_name else 1.0
        worsts = [worst([j for j in judged if j.device == d], key, shipped) for d in devices]
        known = [w for w in worsts if w is not None]
        margin = _f(limit - max(known), ".3f") if known else "–"
        lines.append(f"| {label} | {limit:g} | {ref:g} | " + " | ".join(_f(w, ".3f") for w in worsts)
                     + f" | {margin} |")  # fmt: skip
    return lines


def calibration_summary(judged: list[Judged]) -> list[str]:
    """Per recompute device: files, rows, tokens, honest files invalidated (with the first reason), and
    the verdict of each model's files pooled as one node's window (the validator's pooled check)."""
    th, out = ValidationThresholds(), []
    for d in sorted({j.device for j in judged}):
        mine = [j for j in judged if j.device == d]
        bad = [j for j in mine if j.reasons]
        out.append(f"- {d} recompute: {len(mine)} honest files, {sum(j.rows for j in mine)} rows, "
                   f"{sum(j.tokens for j in mine):,} tokens; invalidated (false positives): {len(bad)}"
                   + (f" — {bad[0].file}: {bad[0].reasons[0][:160]}" if bad else ""))  # fmt: skip
        for model in sorted({j.file.split("-")[0] for j in mine}):
            window = [FileStats.model_validate(j.stats) for j in mine if j.file.startswith(model + "-")]
            reasons = distribution_reasons(pooled(window), th, f"{model}'s {len(window)} files pooled")
            out.append(f"  - {model}, its files pooled as one node's window: "
                       + ("; ".join(reasons) if reasons else "passes"))  # fmt: skip
    return out


def markdown(report: Report) -> str:
    m = report.meta
    attention = ", ".join(sorted(set((m.get("attention_used") or {}).values()))) or "?"
    lines = [
        f"GPU bench ({m.get('mode')}) on {m.get('device_name')}, torch {m.get('torch')}, transformers "
        f"{m.get('transformers')}, {m.get('date')}: {m.get('elapsed_s', 0):.0f} s of a "
        f"{m.get('budget_s', 0):.0f} s budget. Random-weight Qwen2 shapes (vocabulary {m.get('vocab')}), "
        f"bf16, {attention} attention, EOS off (every row decodes the full length), temperature 1, groups "
        f"of {m.get('group')}.",
        "",
        *throughput_table(report.cells),
        "",
        "decode ms/step: the run without proofs (with them where that run was skipped); proof overhead: "
        "the two runs' wall-clock difference; proof build s: building the proofs after decoding, inside "
        "the run with proofs; val / gen: validation tok/s ÷ generation tok/s with proofs.",
        "",
        f"Honest files (made on {m.get('device')} by the workload's rollout and file-writing path) judged by "
        "the validator's recomputation (check 8, shipped thresholds) there and on the CPU:",
        "",
        *calibration_table(report.judged),
        "",
        *calibration_summary(report.judged),
    ]
    if report.notes:
        lines += ["", *[f"- {n}" for n in report.notes]]
    return "\n".join(lines) + "\n"


def write(report: Report, out: Path) -> tuple[Path, Path]:
    """`gpu_bench.json` (every figure) and `gpu_bench.md` (the tables) in `out`; rewritten after each
    cell, so a run cut short leaves what it measured."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"meta": report.meta, "cells": [asdict(c) for c in report.cells],
            "judged": [asdict(j) for j in report.judged], "notes": report.notes}  # fmt: skip
    json_path, md_path = out / "gpu_bench.json", out / "gpu_bench.md"
    json_path.write_text(json.dumps(data, indent=2, default=str))
    md_path.write_text(markdown(report))
    return json_path, md_path
