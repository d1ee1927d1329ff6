"""Trainer settings: flags override `INTELLECT_TRAIN_*` environment variables, which override `.env`.

Defaults are the reference's (prime-rl, INTELLECT-2) except where the shipped tiny model needs other
values to learn visibly within a CPU demo of a few dozen steps; `TrainerSettings.for_cpu_demo()` holds
those, each with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from intellect.device import DEVICE_SETTINGS, check_device_setting
from intellect.settings import IntellectSettings


class TrainerSettings(IntellectSettings):
    model_config = SettingsConfigDict(
        env_prefix="INTELLECT_TRAIN_", env_file=".env", extra="ignore", cli_kebab_case=True,
        cli_implicit_flags=True, cli_prog_name="intellect-train",
    )  # fmt: skip

    cpu_demo: bool = Field(
        False, description="the tiny model on CPU: the demo's learning rate, clip, group size, rows and "
        "minibatches (TrainerSettings.for_cpu_demo); flags given beside it win",
    )
    model: str = Field("tiny", description="base model: 'tiny' (shipped), a HF name or a local path")
    device: str = Field(
        "auto", description=f"where the model trains: {DEVICE_SETTINGS} (auto: the first GPU PyTorch "
        "sees, else the CPU); fp32 weights, bf16 autocast on a GPU",
    )
    output_dir: Path = Field(Path("checkpoints"), description="checkpoints, manifests and trainer state")
    rollouts: str = Field(
        "rollouts", description="validated rollouts: a validator URL (its /accepted feed) or a local folder"
    )
    pool_id: int | None = Field(None, description="pool whose accepted files to read (validator feed)")
    public_url: str | None = Field(None, description="URL workers reach this trainer at (checkpoint links)")
    host: str = Field("127.0.0.1")
    port: int = Field(8092, ge=0, le=65535, description="step counter and checkpoint server (0: free port)")
    group_size: int = Field(16, ge=2, description="completions per prompt (GRPO group)")
    rows_per_step: int = Field(256, ge=1, description="informative rows needed to take a step")
    max_steps: int = Field(0, ge=0, description="stop after this step; 0 trains forever")
    async_level: int = Field(2, ge=0, description="rollouts may come from a policy this many steps old")
    lr: float = Field(3e-7, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    epsilon: float = Field(0.2, gt=0, description="two-sided clipping of the ratio")
    delta: float = Field(4.0, gt=1, description="cap on the ratio")
    kl_coef: float = Field(0.001, ge=0, description="k3 KL to the reference (base) policy")
    entropy_coef: float = Field(1e-4, ge=0)
    grad_clip: float = Field(0.1, gt=0, description="gradient norm clip")
    updates_per_step: int = Field(1, ge=1, description="optimizer updates per step (minibatches)")
    minibatch_rows: int = Field(
        0, ge=0, description="if set, rows per optimizer update instead: a step with more rows takes more "
        "updates (at most max_updates_per_step), so a bigger pool does not learn slower per step",
    )
    max_updates_per_step: int = Field(8, ge=1, description="cap on updates when minibatch_rows is set")
    keep: int = Field(5, ge=1, description="newest checkpoints kept on disk whatever their age (older ones "
                      "stay while files naming them may still be judged: vote_window_seconds)")
    vote_window_seconds: float = Field(
        24 * 3600.0, ge=0, description="seconds validators may vote on a file after its submission: the "
        "pool's slashing-policy window on chain, else the contract's invalidation window (deploy default "
        "24 h; the devnet demo's 300 s). Checkpoints stay on disk and served by URL (GET /checkpoints/N) "
        "until the files that may name them can no longer be judged (until the trainer passes step "
        "N + 2 x async_level, plus this window and a 60 s grace), and after max_steps the trainer serves "
        "on until nobody has asked for a step or a checkpoint for this long. Set it to the pool's window: "
        "shorter, an honest file judged late is not paid ('no checkpoint of step N can be had'); 0: keep "
        "only `keep` and stop at max_steps",
    )
    seed: int = Field(0)
    poll_seconds: float = Field(1.0, gt=0)
    nproc: int = Field(
        1, ge=1, le=64, description="processes (ranks) on this machine to shard the policy over with FSDP2 "
        "(gloo on CPUs, NCCL on GPUs: one GPU a rank); above 1 the command hands itself to torchrun's "
        "elastic agent. Across machines, start `torchrun ... -m workloads.trainer` (docs/trainer.md)",
    )
    max_restarts: int = Field(
        0, ge=0, description="with --nproc: times torchrun restarts every rank after one fails; each restart "
        "resumes from the last published step",
    )
    collective_timeout_seconds: float = Field(
        600.0, gt=0, description="with several ranks: a collective (a rank waiting for the others) that "
        "takes longer fails the job instead of hanging it; above the longest step and rollout wait",
    )

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device_setting(value)

    @classmethod
    def for_cpu_demo(cls, **overrides: Any) -> TrainerSettings:
        """The tiny model on CPU (measured: mean task reward 0.33 → 0.50 in 30 steps, held-out
        accuracy 0.36 → 0.48; see docs/trainer.md). A reference learning rate (3e-7, for billions of
        weights and thousands of rollouts a step) would not move 0.8 M weights in 30 steps, so the
        demo takes 3e-4 (1e-3 collapses the policy) with a gradient clip of 1.0 (its per-weight
        gradients are far larger), groups of 4 completions and at least 128 informative rows a step:
        about half a second of CPU per step. Updates go by minibatches of 32 rows, so a step takes one
        update per 32 rows it collected (4 at 128 rows, 5 at 160, at most 8): a step usually collects
        more than the minimum (whole files), and a pool whose workers deliver more informative rows
        per step then learns faster per step, not slower."""
        values: dict[str, Any] = {  # field values of every type, validated by the settings model
            "cpu_demo": True, "lr": 3e-4, "grad_clip": 1.0, "group_size": 4, "rows_per_step": 128,
            "minibatch_rows": 32,
        }  # fmt: skip
        return cls(**(values | overrides))
