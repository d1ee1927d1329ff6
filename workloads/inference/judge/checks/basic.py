"""Checks 1–3: the file is the one recorded on chain, it is a rollout file of exactly the versioned
schema within the task's bounds, and the work units claimed on chain are its output tokens."""

from __future__ import annotations

import hashlib
import math

from workloads.inference.judge.checks.context import FileContext, rows_named
from workloads.inference.judge.reader import CappedReader
from workloads.rollouts import FileLimits, RolloutSchemaError


def file_identity(ctx: FileContext, max_bytes: int) -> list[str]:
    """Check 1 (a failure here is soft: the fault may be the storage's, not the node's)."""
    ctx.size = ctx.path.stat().st_size
    if ctx.size > max_bytes:
        return [f"file: {ctx.size} bytes, over the {max_bytes}-byte limit"]
    digest = hashlib.sha256()
    with open(ctx.path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    ctx.sha256 = digest.hexdigest()
    want = (ctx.submission.work_key or "").lower().removeprefix("0x")
    if want and want != ctx.sha256:
        return [f"file: sha256 {ctx.sha256} is not the work key 0x{want} recorded on chain"]
    return []


def schema_and_bounds(ctx: FileContext, reader: CappedReader) -> list[str]:
    """Check 2: exact schema, one batch of the task's shape, every value in range. The parquet footer
    is checked against the task's shape before any data is decompressed (a few KB can declare GBs),
    and the file is read in the memory-capped reader process (pages can hold more than the footer
    says). A reader that dies proves nothing: `ReaderFailed` goes up to the judge loop's retries."""
    task = ctx.task
    limits = FileLimits.for_task(task.batch_size, task.n, task.max_prompt_tokens, task.max_new_tokens)
    try:
        ctx.rows, ctx.info = reader.read(ctx.path, limits)
    except RolloutSchemaError as exc:
        return [f"schema: {exc}"]
    info, reasons = ctx.info, []
    expected_rows = task.batch_size * task.n
    if info.group_size != task.n:
        reasons.append(f"bounds: groups of {info.group_size} completions, the task asks for {task.n}")
    if len(ctx.rows) != expected_rows:
        reasons.append(f"bounds: {len(ctx.rows)} rows, the task's batch is {task.batch_size}×{task.n}")
    if info.max_new_tokens != task.max_new_tokens:
        reasons.append(
            f"bounds: the file claims max_new_tokens {info.max_new_tokens}, the task {task.max_new_tokens}"
        )
    bad_vocab, too_long, bad_step, bad_temp, not_finite, bad_lp = [], [], [], [], [], []
    for i, r in enumerate(ctx.rows):
        if any(not 0 <= t < ctx.vocab_size for t in r.input_tokens + r.output_tokens):
            bad_vocab.append(i)
        if len(r.output_tokens) > task.max_new_tokens or len(r.input_tokens) > task.max_prompt_tokens:
            too_long.append(i)
        if r.step != info.step:
            bad_step.append(i)
        if not math.isclose(r.temperature, task.temperature, rel_tol=0, abs_tol=1e-6):
            bad_temp.append(i)
        numbers = [r.advantages, r.rewards, r.task_rewards, r.length_penalties, *r.output_logprobs]
        if not all(math.isfinite(x) for x in numbers):
            not_finite.append(i)
        elif any(lp > 1e-6 for lp in r.output_logprobs) or not 0.0 <= r.task_rewards <= 1.0:
            bad_lp.append(i)
    for rows, what in (
        (bad_vocab, f"token ids outside the vocabulary of {ctx.vocab_size}"),
        (too_long, f"longer than the task allows ({task.max_new_tokens} new tokens)"),
        (bad_step, f"a step other than the file's step {info.step}"),
        (bad_temp, f"a temperature other than the task's {task.temperature}"),
        (not_finite, "a non-finite number"),
        (bad_lp, "a logprob above 0 or a task reward outside [0, 1]"),
    ):
        if rows:
            reasons.append(f"bounds: {rows_named(rows)} with {what}")
    return reasons


def work_units(ctx: FileContext) -> list[str]:
    """Check 3: units claimed on chain == output tokens in the file (inflated units are fraud)."""
    claimed = ctx.submission.work_units
    if claimed is not None and claimed != ctx.tokens:
        return [f"work units: {claimed} claimed on chain for {ctx.tokens} output tokens in the file"]
    return []
