"""The recomputation's limits for one model, derived from its measured honest noise and cheats.

Used by `intellect-validator calibrate` (workloads/inference/judge/calibrate.py). Every limit is a rule
stated here
and in docs/validator.md ("Calibration per model"), so a record can be re-derived and argued with:

- **Units that do not depend on the model** are kept: TOPLOC errors are already counted in bf16
  mantissa steps of the values compared (their spacing), logprob errors in nats, Gumbel gaps in score
  units. What still depends on the model is how much honest rounding noise a forward pass gathers
  (depth, width, trained or random weights): that is measured, and the limits follow it.
- **Logprob rules in units of the model's own per-token noise** σ (measured as √(π/2) × the worst
  file's mean |error|, the normal's ratio): the bias spread assumed 3σ, the outlier level 25σ, the
  per-token cap 10/3 of the outlier level; each never below the shipped default (calibrated on the
  tiny model, trained checkpoints included), so a record only ever loosens a logprob rule where the
  model is noisier.
- **Row rules (per TOPLOC chunk, the sampling cap, the row mean)**: at least twice the worst honest
  value (honest at ≤ 50 % of the limit), never below the default.
- **File statistics (TOPLOC mantissa mean, share of chunks with median ≥ 1)**: above the worst honest
  file by a margin, and where a cheat sits well above (≥ 1.2× the honest worst) between the two:
  mean limit = max(1.25 h, min(1.5 h, √(1.25 h × c))) for worst honest h and the lowest such cheat c,
  1.5 h where no cheat separates. The share limit is h + 0.375 (three chunks of the smallest judged
  file, 8 chunks, above the worst honest), and 1.0 (off) where that reaches 1: on wide or deep models
  nearly every honest chunk has a median of 1 and the share says nothing. Past 0.8 a share can never
  be 1.25 x its limit, so there it is only ever marginal evidence (not paid; the 4th marked file of
  16 slashes): an 8-chunk honest file whose chunks each reach a median of 1 with p = 0.4 passes
  0.875 with p = 0.4^8 = 7e-4, four such files in sixteen with p ~ 3e-10.
- The bias floor is raised to twice the worst honest file bias where the default floor would leave
  honest files above half their limit.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from pydantic import BaseModel

from workloads.inference.judge.checks.model import FileStats
from workloads.inference.judge.grades import Finding
from workloads.inference.judge.thresholds import ValidationThresholds

SEPARATES = 1.2  # a cheat this many times the honest worst is "well above"
HONEST_SHARE = 0.5  # row rules: honest values at most this share of their limit
MEAN_MARGIN, MEAN_FLOOR = 1.5, 1.25  # file mantissa mean: limit / worst honest, without and with a cheat near
SHARE_ROOM = 0.375  # file share: three chunks of the smallest judged file (8) above the worst honest
FILE_FIELDS = ("mant_mean", "median_chunk_share")
NO_MATCH = 1e18  # TOPLOC's 2**64 "no exponent matched" (another model entirely)


class Sample(BaseModel):
    """One file recomputed at one prefill batch."""

    setting: str
    prefill: int
    stats: FileStats


class Derived(BaseModel):
    thresholds: dict[str, float | int]
    table: list[dict[str, Any]]


def _up(value: float, places: int = 3) -> float:
    scale = 10**places
    return math.ceil(round(value * scale, 6)) / scale  # 1.5 x 0.8 is 1.2000000000000002: still 1.2


class LimitTable:
    """The record's table of what each limit rests on: per statistic the limit, the worst honest value
    (with the honest files' spread for the file statistics) and each cheat's lowest value over it."""

    def __init__(self, files: list[FileStats], cheating: list[Sample]) -> None:
        self.files = files  # honest files with enough chunks for the file statistics
        self.cheating = cheating
        self.rows: list[dict[str, Any]] = []

    def add(self, statistic: str, field: str, limit: float, worst: float, value: Any = None) -> None:
        by_cheat: dict[str, float] = {}
        for kind, stats in [(s.setting, s.stats) for s in self.cheating]:
            v = float(value(stats) if value else getattr(stats, field))
            by_cheat[kind] = min(by_cheat.get(kind, math.inf), v)
        self.rows.append({
            "statistic": statistic, "limit": limit, "worst_honest": worst,
            "honest_share_of_limit": round(worst / limit, 3) if limit else None,
            **(_spread([float(getattr(f, field)) for f in self.files]) if field in FILE_FIELDS else {}),
            "cheats_over_limit": {
                k: (round(v / limit, 2) if limit and v < NO_MATCH else "no exponent matches")
                for k, v in by_cheat.items()
            },
        })  # fmt: skip


def _spread(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {}
    mu = sum(values) / len(values)
    sd = math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - 1))
    return {"honest_mean": round(mu, 4), "honest_sd": round(sd, 4), "files": len(values)}


def derive(honest: list[Sample], cheating: list[Sample]) -> Derived:
    """The limits for the model these samples were measured on (the rules in the module's docstring)."""
    d = ValidationThresholds.defaults()
    new: dict[str, float | int] = {}
    table = LimitTable([s.stats for s in honest if s.stats.chunks >= d.file_min_chunks], cheating)
    cheat_files = [s.stats for s in cheating if s.stats.chunks >= d.file_min_chunks]
    every = [s.stats for s in honest]
    _file_limits(new, table, d, cheat_files)
    _row_limits(new, table, d, every)
    sigma = _logprob_limits(new, table, d, every)
    table.rows.append({"statistic": "per-token noise sigma (nats)", "measured": round(sigma, 5)})
    changed = {k: v for k, v in new.items() if v != getattr(d, k)}
    return Derived(thresholds=changed, table=table.rows)


def _file_limits(
    new: dict[str, float | int], table: LimitTable, d: ValidationThresholds, cheat_files: list[FileStats]
) -> None:
    """The file statistics: the TOPLOC mantissa mean and the share of chunks with median >= 1."""
    h = max((s.mant_mean for s in table.files), default=0.0)
    above = [st.mant_mean for st in cheat_files if st.mant_mean >= SEPARATES * h]
    mean_limit = d.file_max_mant_mean
    if h:
        near = math.sqrt(MEAN_FLOOR * h * min(above)) if above else math.inf
        mean_limit = _up(max(MEAN_FLOOR * h, min(MEAN_MARGIN * h, near)))
    new["file_max_mant_mean"] = mean_limit
    table.add("file TOPLOC mantissa mean", "mant_mean", mean_limit, h)
    h = max((s.median_chunk_share for s in table.files), default=0.0)
    share_limit = h + SHARE_ROOM
    share_limit = 1.0 if share_limit >= 1 else _up(share_limit)
    new["file_max_median_chunks"] = share_limit
    table.add("file share of chunks with median >= 1", "median_chunk_share", share_limit, h)


def _row_limits(
    new: dict[str, float | int], table: LimitTable, d: ValidationThresholds, every: list[FileStats]
) -> None:
    """The row rules: twice the worst honest value, never below the default."""
    for field, stat, label, cast in (
        ("chunk_max_exp_mismatches", "max_exp_mismatches", "chunk exponent mismatches", int),
        ("chunk_max_mant_mean", "max_chunk_mean", "chunk mantissa mean", float),
        ("chunk_max_mant_median", "max_chunk_median", "chunk mantissa median", float),
        ("sampling_max_gap", "max_gap", "Gumbel gap (cap)", float),
    ):
        worst = max((float(getattr(s, stat)) for s in every), default=0.0)
        default = float(getattr(d, field))
        limit = max(default, worst / HONEST_SHARE)
        new[field] = cast(math.ceil(limit)) if cast is int else _up(limit)
        table.add(label, stat, float(new[field]), worst)


def _logprob_limits(
    new: dict[str, float | int], table: LimitTable, d: ValidationThresholds, every: list[FileStats]
) -> float:
    """The logprob rules, in units of the model's per-token noise σ; returns σ."""
    sigma = max(
        (math.sqrt(math.pi / 2) * s.lp_abs_sum / s.lp_tokens for s in every if s.lp_tokens), default=0.0
    )
    new["logprob_bias_sigma"] = _up(max(d.logprob_bias_sigma, 3 * sigma), 4)
    new["logprob_outlier"] = _up(max(d.logprob_outlier, 25 * sigma))
    new["logprob_tolerance"] = _up(max(d.logprob_tolerance, new["logprob_outlier"] * 10 / 3))
    worst_token = max((s.max_logprob_error for s in every), default=0.0)
    table.add("token logprob |error| (cap)", "max_logprob_error", float(new["logprob_tolerance"]),
              worst_token)  # fmt: skip
    worst_share = max((s.max_row_mean_share for s in every), default=0.0)  # of the default row limit
    mean_tolerance = max(d.logprob_mean_tolerance, d.logprob_mean_tolerance * worst_share / HONEST_SHARE)
    new["logprob_mean_tolerance"] = _up(mean_tolerance, 4)
    scaled = worst_share * d.logprob_mean_tolerance / float(new["logprob_mean_tolerance"])
    table.add("row mean |error| / its limit", "max_row_mean_share", 1.0, scaled)
    th = d.model_copy(update=new)
    bias = [abs(s.lp_bias) for s in every if s.lp_tokens]
    shares = [abs(s.lp_bias) / th.bias_limit(s.lp_tokens) for s in every if s.lp_tokens]
    if shares and max(shares) > HONEST_SHARE:
        new["logprob_bias_floor"] = _up(max(d.logprob_bias_floor, 2 * max(bias)), 4)
        th = d.model_copy(update=new)
        shares = [abs(s.lp_bias) / th.bias_limit(s.lp_tokens) for s in every if s.lp_tokens]

    def share(s: FileStats) -> float:
        return abs(s.lp_bias) / th.bias_limit(s.lp_tokens) if s.lp_tokens else 0.0

    table.add("|logprob bias| / its limit", "lp_bias", 1.0, max(shares, default=0.0), value=share)
    worst_outliers = max((s.max_row_outliers for s in every), default=0)
    label = "tokens beyond the default outlier level in one row"  # an upper bound where the level rose
    table.add(label, "max_row_outliers", d.logprob_max_outliers, worst_outliers)
    return sigma


def failing_rules(verdicts: list[list[Finding]]) -> dict[str, Any]:
    """Honest recomputations failing under the derived limits, per rule (each must be 0)."""
    per_rule: Counter[str] = Counter(f.rule for findings in verdicts for f in findings)
    failed = sum(1 for findings in verdicts if findings)
    n = len(verdicts)
    return {
        "recomputations": n,
        "failing": failed,
        "per_rule": dict(per_rule),
        "upper_95": round(3 / n, 4) if n and not failed else None,  # the rule of three
    }
