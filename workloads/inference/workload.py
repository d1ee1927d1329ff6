"""The inference workload's loop: follow the trainer's step, keep the right checkpoint loaded, write
one proven rollout file per batch, announce it on the worker's bridge (or just write it, standalone).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import structlog
from pydantic import BaseModel
from safetensors.torch import load_file

from intellect.device import resolve_device
from intellect.http_client import shared as http_client
from workloads.datasets import load_dataset
from workloads.inference.cheats import claimed_units, forge_rewards, perturb_model, perturbed_state
from workloads.inference.checkpoints import CheckpointError, CheckpointStore
from workloads.inference.generate import DTYPES, make_rollouts
from workloads.inference.selection import plan_batch
from workloads.inference.settings import InferenceSettings
from workloads.model.backends import InferenceBackend, TorchBackend
from workloads.model.loading import base_checkpoint_sha256, load_model, load_tokenizer, load_weights, resolve
from workloads.model.vllm_backend import VLLMBackend
from workloads.rollouts import BatchInfo, write_rollouts

log = structlog.get_logger(__name__)

WARN_EVERY_SECONDS = 60.0  # a wait for a checkpoint that does not change is warned about this often


class BatchReport(BaseModel):
    path: str
    sha256: str
    step: int
    batch_counter: int
    checkpoint_step: int
    rows: int
    work_units: int
    tokens_per_second: float
    reward_mean: float
    task_reward_mean: float
    proof_seconds: float
    seconds: float


def bridge_enabled() -> bool:
    return bool(os.environ.get("INTELLECT_SOCKET_PATH"))


class InferenceWorkload:
    def __init__(self, settings: InferenceSettings):
        self.s = settings
        # Set by the worker for every task it runs: salts each batch's plan (see BatchInfo.task_id).
        self.task_id = os.environ.get("INTELLECT_TASK_ID", "")
        self.records = load_dataset(settings.dataset)
        self.tokenizer = load_tokenizer(settings.model)
        self.model = None
        # Refused here, before anything loads, with the setting named: CUDA asked where there is none.
        self.device = resolve_device(settings.device)
        self.vllm: VLLMBackend | None = None
        self.made_on = self.device.type  # the device type the files state (BatchInfo.device)
        if settings.backend == "vllm":
            # One engine per process, started here once and kept for every batch and checkpoint.
            self.vllm = VLLMBackend.shared(resolve(settings.model), dtype=settings.dtype,
                                           eos_token_id=self.tokenizer.eos_token_id,
                                           cpu=self.device.type == "cpu")  # fmt: skip
            if self.vllm.serving != "base" or settings.cheat == "perturbed-model":
                self._serve(None)  # an engine an earlier workload of this process left other weights in
            self.backend: InferenceBackend = self.vllm
            self.made_on = self.vllm.device  # where the engine's model runs, whatever was asked
        else:
            self.model = load_model(settings.model, dtype=DTYPES[settings.dtype], device=self.device)
            if settings.cheat == "perturbed-model":
                perturb_model(self.model)
            self.backend = TorchBackend(self.model, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        self.store = (
            CheckpointStore(settings.checkpoint_source, settings.checkpoint_cache, settings.async_level + 1)
            if settings.checkpoint_source
            else None
        )
        self.checkpoint_step = 0  # step 0 is the base model
        self.capped_at: float | None = None  # when files_per_step paused this step
        self._warned: tuple[object, float] = (None, 0.0)  # last warned (step, answers) and when
        self.checkpoint_sha256: str | None = base_checkpoint_sha256(settings.model)
        self.step: int | None = None
        settings.output_dir.mkdir(parents=True, exist_ok=True)
        self.batch_counter = self.last_counter()  # counters run across steps; a restart carries on
        self.step_files = 0  # files made for the current step (files_per_step caps it)

    def _written(self, step: int | None = None) -> list[tuple[int, int]]:
        """(step, counter) of every file this node already wrote here (of `step` only, if given)."""
        node = self.s.node_address.lower().removeprefix("0x")
        found = []
        for p in self.s.output_dir.glob(f"rollouts-{node}-step*-batch*.parquet"):
            head, _, counter = p.stem.rpartition("-batch")
            label = head.rpartition("-step")[2]
            if label.isdigit() and counter.isdigit() and (step is None or int(label) == step):
                found.append((int(label), int(counter)))
        return found

    def last_counter(self) -> int:
        """The highest batch counter this node already wrote (0: none). Counters run across steps (a
        plan is (task, node, counter): selection.py); a restarted workload carries on from there:
        reusing a counter would repeat a plan (a duplicate the validators invalidate), and skipping one
        leaves a gap they do not pay (docs/validator.md, "Selection")."""
        return max((counter for _, counter in self._written()), default=0)

    def current_step(self) -> int:
        if not self.s.step_url:
            return self.s.step
        resp = http_client().get(self.s.step_url, timeout=10.0)
        resp.raise_for_status()
        step = resp.json().get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(
                f"step counter at {self.s.step_url} returned {resp.text[:200]!r}; expected {{'step': int}}"
            )
        return step

    def ensure_checkpoint(self, step: int) -> bool:
        """Load the newest checkpoint in [step - async_level, step]; False if none is available yet."""
        if self.store is None:  # nothing to fetch: the configured model serves every step
            return self._use_base()
        oldest = max(0, step - self.s.async_level)
        if oldest <= self.checkpoint_step <= step:
            newer = range(step, self.checkpoint_step, -1)
        else:
            newer = range(step, oldest - 1, -1)
        for candidate in newer:
            if candidate == 0:
                return self._use_base()
            path = self.store.fetch(candidate)
            if path is not None:
                self._serve(path)
                self.checkpoint_step = candidate
                self.checkpoint_sha256 = self.store.sha256(candidate)
                log.info("serving checkpoint", checkpoint_step=candidate, step=step)
                return True
        return oldest <= self.checkpoint_step <= step

    def _report_no_checkpoint(self, step: int) -> None:
        """Waiting for a checkpoint is normal for a moment (the trainer just moved on, the broadcast is
        catching up); a source that never has one (a wrong URL form, relays nobody runs) is not. So the
        wait is a warning naming what each candidate step's source answered (URL and status), once per
        step and answer and again every WARN_EVERY_SECONDS; in between, info."""
        oldest = max(0, step - self.s.async_level)
        misses = self.store.misses if self.store is not None else {}
        tried = [misses[c] for c in range(step, oldest - 1, -1) if c in misses]
        key, now = (step, tuple(tried)), time.monotonic()
        warn = key != self._warned[0] or now - self._warned[1] >= WARN_EVERY_SECONDS
        if warn:
            self._warned = (key, now)
        (log.warning if warn else log.info)(
            "no checkpoint within the async level yet", step=step, async_level=self.s.async_level,
            source=self.s.checkpoint_source, tried=tried,
        )  # fmt: skip

    def _serve(self, path: Path | None) -> None:
        """Serve a checkpoint's weights (None: the base model's) from the model or the vLLM engine."""
        if self.vllm is not None:
            weights = path or Path(resolve(self.s.model)) / "model.safetensors"
            if self.s.cheat == "perturbed-model":
                self.vllm.load_state(perturbed_state(self.s.model, weights), serving=f"perturbed {weights}")
            else:
                self.vllm.load_state(load_file(str(weights)), serving="base" if path is None else str(path))
            return
        assert self.model is not None
        if path is None:
            base = load_model(self.s.model, dtype=DTYPES[self.s.dtype], device=self.device)
            self.model.load_state_dict(base.state_dict())
        else:
            load_weights(self.model, path)
        if self.s.cheat == "perturbed-model":
            perturb_model(self.model)

    def _use_base(self) -> bool:
        if self.checkpoint_step != 0:
            self._serve(None)
        self.checkpoint_step = 0
        self.checkpoint_sha256 = base_checkpoint_sha256(self.s.model)
        return True

    def run_batch(self) -> BatchReport | None:
        started = time.perf_counter()
        step = self.current_step()
        if step != self.step:
            self.step, self.step_files, self.capped_at = step, len(self._written(step)), None
        if self.s.files_per_step and self.step_files >= self.s.files_per_step:
            # This step has its share from us: wait for the trainer to move on, but never forever
            # (a step short of informative groups would otherwise stall the whole pool).
            now = time.monotonic()
            if self.capped_at is None or now - self.capped_at < self.s.step_patience_seconds:
                self.capped_at = self.capped_at or now
                return None
            self.capped_at = now
        if not self.ensure_checkpoint(step):
            self._report_no_checkpoint(step)
            return None
        self.batch_counter += 1
        self.step_files += 1
        plan = plan_batch(
            self.s.node_address, self.batch_counter, len(self.records),
            self.s.batch_size, self.s.n, self.s.target_lengths, self.task_id,
        )  # fmt: skip
        rollouts, timings = make_rollouts(
            self.backend, self.tokenizer, self.records, plan,
            step=step, max_new_tokens=self.s.max_new_tokens, temperature=self.s.temperature,
            length_penalty=self.s.length_penalty, with_proofs=self.s.proofs,
        )  # fmt: skip
        if self.s.cheat == "forged-reward":
            rollouts = forge_rewards(rollouts, self.s.n)
        node = self.s.node_address.lower().removeprefix("0x")
        path = self.s.output_dir / f"rollouts-{node}-step{step:06d}-batch{self.batch_counter:05d}.parquet"
        info = BatchInfo(
            node_address=self.s.node_address, step=step, batch_counter=self.batch_counter,
            group_size=self.s.n, max_new_tokens=self.s.max_new_tokens, model=self.s.model,
            checkpoint_step=self.checkpoint_step, checkpoint_sha256=self.checkpoint_sha256,
            task_id=self.task_id, device=self.made_on,  # where it was made: judged by that part
        )  # fmt: skip
        digest = write_rollouts(path, rollouts, info)
        tokens = claimed_units(sum(len(r.output_tokens) for r in rollouts), self.s.cheat)
        report = BatchReport(
            path=str(path), sha256=digest, step=step, batch_counter=self.batch_counter,
            checkpoint_step=self.checkpoint_step, rows=len(rollouts), work_units=tokens,
            tokens_per_second=tokens / max(timings.generate, 1e-9),
            reward_mean=sum(r.rewards for r in rollouts) / len(rollouts),
            task_reward_mean=sum(r.task_rewards for r in rollouts) / len(rollouts),
            proof_seconds=timings.proofs, seconds=time.perf_counter() - started,
        )  # fmt: skip
        if bridge_enabled():
            from workloads.bridge_client import announce_file, report_metrics  # noqa: PLC0415

            announce_file(path, digest, tokens)
            report_metrics(
                {
                    "tokens_per_second": report.tokens_per_second,
                    "reward_mean": report.reward_mean,
                    "task_reward_mean": report.task_reward_mean,
                    "step": float(step),
                }
            )
        return report

    def run(self, on_batch: Callable[[BatchReport], None] = lambda _r: None) -> int:
        done = 0
        while self.s.max_batches == 0 or done < self.s.max_batches:
            try:
                report = self.run_batch()
            except (httpx.HTTPError, CheckpointError, ValueError) as exc:
                # Trainer or relay unreachable, or a corrupt checkpoint (dropped, fetched again
                # later): wait and retry instead of dying, as a long-running worker should.
                log.warning("batch not started; retrying", error=str(exc), retry_seconds=self.s.poll_seconds)
                report = None
            if report is None:
                time.sleep(self.s.poll_seconds)
                continue
            done += 1
            on_batch(report)
        return done
