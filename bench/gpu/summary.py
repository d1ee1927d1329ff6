"""The GPU bench's report: the throughput table, the honest calibration against the validator's
thresholds, and writing both as JSON and markdown. Kept apart from the measuring (bench.py) so
that a partial run (a cell skipped, the run cut short) still reports what it measured."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workloads.inference.judge.calibration import resolve_limits
from workloads.inference.judge.checks.model import FileStats, distribution_reasons, pooled
from workloads.inference.judge.thresholds import ValidationThresholds


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


SHIPPED, REFERENCE = resolve_limits("tiny", {}).thresholds, ValidationThresholds.reference()


def calibration_table(judged: list[Judged]) -> list[str]:
    """Per statistic: both limits, the worst honest value on each recompute device, and the margin
    left to each limit by the worst of them (negative: honest files fail it)."""
    devices = sorted({j.device for j in judged}, key=lambda d: (d != "gpu", d))
    lines = [
        "| statistic | limit (shipped) | limit (reference) | "
        + " | ".join(f"worst honest ({d} recompute)" for d in devices)
        + " | margin (shipped) | margin (reference) |",
        "|---|---:|---:|" + "---:|" * len(devices) + "---:|---:|",
    ]
    for label, key, limit_name in STATISTICS:
        limit = float(getattr(SHIPPED, limit_name)) if limit_name else 1.0
        ref = float(getattr(REFERENCE, limit_name)) if limit_name else 1.0
        worsts = [worst([j for j in judged if j.device == d], key, SHIPPED) for d in devices]
        known = [w for w in worsts if w is not None]
        margins = [_f(x - max(known), ".3f") if known else "–" for x in (limit, ref)]
        lines.append(f"| {label} | {limit:g} | {ref:g} | " + " | ".join(_f(w, ".3f") for w in worsts)
                     + f" | {margins[0]} | {margins[1]} |")  # fmt: skip
    return lines


def model_of(file: str) -> str:
    return file.rsplit("-", 2)[0]  # files are named <model>-<tokens>-<batch>.parquet


def reference_reasons(j: Judged) -> list[str]:
    """The file's verdict under `ValidationThresholds.reference()` (the limits docs/validator.md gives
    for real models), from the same recomputation: the reference changes the TOPLOC limits only, so
    the other reasons stand, and TOPLOC's are re-read from the statistics (a chunk fails when one of
    its figures is past a limit, so the worst chunk figures decide)."""
    ref, s = REFERENCE, FileStats.model_validate(j.stats)
    # TOPLOC's reasons and the file's logprob bias are re-derived below (the bias limit is the same).
    reasons = [r for r in j.reasons if not r.startswith("toploc") and "consistent bias" not in r]
    if (s.max_exp_mismatches > ref.chunk_max_exp_mismatches or s.max_chunk_mean >= ref.chunk_max_mant_mean
            or s.max_chunk_median >= ref.chunk_max_mant_median):  # fmt: skip
        reasons.append("toploc: a chunk past the reference's per-chunk limits")
    return reasons + distribution_reasons(s, ref, "the file")


def verdict(j: Judged) -> str:
    if not j.reasons:
        return "accept"
    ref = reference_reasons(j)
    return (f"INVALIDATED by the shipped thresholds ({j.reasons[0][:100]}); reference thresholds: "
            + ("accept" if not ref else f"invalidated ({ref[0][:80]})"))  # fmt: skip


def calibration_summary(judged: list[Judged]) -> list[str]:
    """Per recompute device: files, rows, tokens, honest files invalidated (false positives) by the
    shipped thresholds and by the reference's, and each model's files pooled as one node's window
    (the validator's pooled check), under both."""
    out = []
    for d in sorted({j.device for j in judged}):
        mine = [j for j in judged if j.device == d]
        bad = [j for j in mine if j.reasons]
        bad_ref = [j for j in mine if reference_reasons(j)]
        out.append(f"- {d} recompute: {len(mine)} honest files, {sum(j.rows for j in mine)} rows, "
                   f"{sum(j.tokens for j in mine):,} tokens; invalidated (false positives): {len(bad)} by "
                   f"the shipped thresholds, {len(bad_ref)} by the reference's"
                   + (f" — {bad[0].file}: {bad[0].reasons[0][:160]}" if bad else ""))  # fmt: skip
        for model in sorted({model_of(j.file) for j in mine}):
            window = pooled([FileStats.model_validate(j.stats) for j in mine if model_of(j.file) == model])
            what = f"{model}'s files pooled"
            for label, th in (("shipped", SHIPPED), ("reference", REFERENCE)):
                reasons = distribution_reasons(window, th, what)
                out.append(f"  - {model}, its files pooled as one node's window, {label} thresholds: "
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
