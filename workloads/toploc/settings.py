"""Acceptance thresholds, overridable by environment (`INTELLECT_TOPLOC_MAX_EXP_MISMATCHES=...`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from intellect.settings import IntellectSettings


class ToplocThresholds(IntellectSettings):
    """A chunk passes when exp_mismatches <= max_exp_mismatches, mean < max_mant_err_mean and
    median < max_mant_err_median (the reference's INTELLECT-2 / SYNTHETIC-2 values).

    The exponent limit is for a full chunk of `topk` points; chunks with fewer points (tiny
    hidden sizes) get the same fraction, rounded down.
    """

    model_config = SettingsConfigDict(env_prefix="INTELLECT_TOPLOC_", env_file=".env", extra="ignore")

    max_exp_mismatches: int = Field(default=38, ge=0, description="inclusive, out of topk points")
    max_mant_err_mean: float = Field(default=10.0, gt=0, description="exclusive")
    max_mant_err_median: float = Field(default=8.0, gt=0, description="exclusive")

    def exp_limit(self, points: int, topk: int) -> int:
        return self.max_exp_mismatches if points >= topk else (self.max_exp_mismatches * points) // topk
