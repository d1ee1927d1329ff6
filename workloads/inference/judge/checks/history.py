"""Checks 4–6: nothing is paid twice, every prompt and seed comes from the submitter's own plan,
and the file belongs to a step (and a checkpoint) the trainer still accepts."""

from __future__ import annotations

import hashlib

from intellect.workloads import NodeWindows
from workloads.inference.judge.checks.context import FileContext, rows_named
from workloads.inference.selection import plan_batch


def row_hash(input_tokens: list[int], output_tokens: list[int], seed: int) -> str:
    blob = ",".join(map(str, input_tokens)) + "|" + ",".join(map(str, output_tokens)) + "|" + str(seed)
    return hashlib.sha256(blob.encode()).hexdigest()


def duplicates(ctx: FileContext) -> list[str]:
    """Check 4: the file, any of its rows, or its (node, step, batch counter) seen before in the pool."""
    assert ctx.info is not None
    pool = ctx.submission.pool_id
    ctx.row_hashes = [row_hash(r.input_tokens, r.output_tokens, r.seed) for r in ctx.rows]
    # Per task: two tasks of one pool each have a step 0, batch 1 for the same node.
    ctx.plan_key = (f"plan:{ctx.info.task_id}:{ctx.info.node_address.lower()}:{ctx.info.step}:"
                    f"{ctx.info.batch_counter}")
    reasons = []
    if ctx.seen.file_seen(pool, ctx.sha256):
        reasons.append(f"duplicate: this file (sha256 {ctx.sha256[:16]}…) was already submitted in this pool")
    within = [i for i, h in enumerate(ctx.row_hashes) if h in ctx.row_hashes[:i]]
    if within:
        reasons.append(f"duplicate: {rows_named(within)} repeat earlier rows of the same file")
    before = ctx.seen.rows_seen(pool, ctx.row_hashes + [ctx.plan_key])
    copied = [i for i, h in enumerate(ctx.row_hashes) if h in before]
    if copied:
        reasons.append(f"duplicate: {rows_named(copied)} were already submitted in an earlier file")
    if ctx.plan_key in before:
        reasons.append(
            f"duplicate: batch counter {ctx.info.batch_counter} of step {ctx.info.step} was already used "
            "by this node"
        )
    return reasons


def plan_derivation(ctx: FileContext) -> list[str]:
    """Check 5: prompts, seeds and target lengths are exactly the submitter's plan for (step, counter)."""
    assert ctx.info is not None
    info, task, reasons = ctx.info, ctx.task, []
    submitter = (ctx.submission.node or info.node_address).lower()
    if info.node_address.lower() != submitter:
        reasons.append(f"plan: the file was planned for node {info.node_address}, submitted by {submitter}")
    if ctx.task_id and info.task_id != ctx.task_id:
        # The task id salts the plan: a file free to name any task could pick among plans (grinding).
        reasons.append(f"plan: the file was planned for task {info.task_id or '(none)'}, uploaded for "
                       f"task {ctx.task_id}")
    try:
        plan = plan_batch(
            submitter,
            info.step,
            info.batch_counter,
            len(ctx.records),
            task.batch_size,
            task.n,
            task.target_lengths,
            info.task_id,
        )
    except ValueError as exc:
        return reasons + [f"plan: {exc}"]
    prompts: dict[int, list[int]] = {}
    wrong_prompt, wrong_seed, wrong_target, wrong_record = [], [], [], []
    for i, r in enumerate(ctx.rows):
        group = i // task.n
        if group >= len(plan.indexes):
            break
        index = plan.indexes[group]
        record = ctx.records[index]
        if index not in prompts:
            prompts[index] = ctx.tokenizer(record.prompt)["input_ids"]
        if r.input_tokens != prompts[index]:
            wrong_prompt.append(i)
        if r.seed != plan.seeds[i]:
            wrong_seed.append(i)
        if r.target_lengths != plan.target_lengths[group]:
            wrong_target.append(i)
        if r.problem_id != record.problem_id or r.task_type != record.task_type:
            wrong_record.append(i)
    for rows, what in (
        (wrong_prompt, "prompts that are not the plan's"),
        (wrong_seed, "sampling seeds that are not the plan's"),
        (wrong_target, "target lengths that are not the plan's"),
        (wrong_record, "a problem id or task type that is not the plan's"),
    ):
        if rows:
            reasons.append(f"plan: {rows_named(rows)} with {what}")
    return reasons


def counter_order(ctx: FileContext, windows: NodeWindows) -> list[str]:
    """Grinding: a node must submit a step's batch counters in order, 1, 2, 3, ... (judged in chain
    order: the judge loop holds a node's file until its earlier ones have verdicts). Seeds and prompts
    come from (node, step, counter), so a node that made 16 batches and submitted only its best would
    otherwise choose its data. A counter past the next one (a gap) is not paid: soft-invalidated, not
    slashed (an honest worker can leave a gap when an upload is refused for good), and the count
    continues from it. So a ground batch is never paid nor trained on, and a node that abstains from a
    bad batch forfeits the next one as well.

    Every submitted file whose header can be read counts, whatever its verdict: the pipeline calls
    this before any other check can fail (a file that was invalidated, or soft-invalidated for a
    reason of the validator's, still used its counter; counting only accepted files made the node's
    next honest file look like a gap). A file judged again (a retry after an error of the validator's)
    is not counted twice: the window names each entry's file. A file the validator never read (storage
    unreachable until the deadline, `Submission.counters_unknown`) may have used the next counter: that
    many are allowed skipped."""
    assert ctx.info is not None
    node = (ctx.submission.node or ctx.info.node_address).lower()
    key = f"{node}#{ctx.info.task_id}#step{ctx.info.step}"
    entry = {"counter": ctx.info.batch_counter, "file": ctx.sha256}
    window = windows.push(ctx.submission.pool_id, key, entry, keep=4)
    earlier = [entry for entry in window[:-1] if entry.get("file") != ctx.sha256]
    previous = int(earlier[-1]["counter"]) if earlier else 0
    skipped = ctx.submission.counters_unknown  # files of the node storage kept from this validator
    if not previous + 1 <= ctx.info.batch_counter <= previous + 1 + skipped:
        due = f"{previous + 1}" if not skipped else f"{previous + 1} to {previous + 1 + skipped}"
        return [f"grinding: batch counter {ctx.info.batch_counter} of step {ctx.info.step} where "
                f"{due} was due (a node's counters of a step must follow each other)"]  # fmt: skip
    return []


def freshness(ctx: FileContext) -> list[str]:
    """Check 6: the file's step is not ahead of the trainer's step at submission, and the checkpoint
    it names is in that step's window and, when the trainer still has it, is the trainer's file.

    Only what the node controls is judged here (these reasons slash). What depends on the validator's
    own timing is `unverifiable_freshness`."""
    assert ctx.info is not None
    info, level, reasons = ctx.info, ctx.task.async_level, []
    trainer = ctx.submission.trainer_step
    if trainer is not None and info.step > trainer:
        # The trainer's step only grows: read late, it is still never behind a file's honest step.
        reasons.append(
            f"freshness: step {info.step} is ahead of the trainer's step {trainer} at submission "
            f"(window [{trainer - level}, {trainer}], async level {level})"
        )
    if info.checkpoint_step is None:
        return reasons + ["freshness: the file does not name the checkpoint that generated it"]
    if not info.step - level <= info.checkpoint_step <= info.step:
        reasons.append(
            f"freshness: checkpoint of step {info.checkpoint_step} is outside "
            f"[{info.step - level}, {info.step}]"
        )
    known = ctx.checkpoints.checkpoint_for(info.checkpoint_step)
    if known is not None and info.checkpoint_sha256 is not None and info.checkpoint_sha256 != known[1]:
        reasons.append(
            f"freshness: checkpoint sha256 {info.checkpoint_sha256[:16]}… is not step "
            f"{info.checkpoint_step}'s {known[1][:16]}…"
        )
    return reasons


def unverifiable_freshness(ctx: FileContext) -> list[str]:
    """What makes a file unpayable without proving its node cheated (soft: not paid, never slashed):
    - its step is behind the trainer's window at submission (the earliest step the trainer may have
      been at, the block time less a clock grace: `Submission.trainer_step_before`). The watcher asks
      the trainer for the step in force at the block's time, so a validator that reads the chain late
      or restarts judges the same; a trainer that cannot say (older, or down) gives the step now, which
      can only make an honest file look stale, hence soft;
    - the checkpoint it names can no longer be had: the trainer lists only its window and keeps few
      files, and a validator that fell behind may never have fetched it."""
    assert ctx.info is not None
    info, level, reasons = ctx.info, ctx.task.async_level, []
    trainer = ctx.submission.trainer_step_before
    trainer = ctx.submission.trainer_step if trainer is None else trainer
    if trainer is not None and info.step < trainer - level:
        reasons.append(
            f"freshness: step {info.step} is behind the trainer's window [{trainer - level}, {trainer}] "
            f"at submission (async level {level})"
        )
    if info.checkpoint_step is not None and ctx.checkpoints.checkpoint_for(info.checkpoint_step) is None:
        reasons.append(f"freshness: no checkpoint of step {info.checkpoint_step} can be had from the trainer")
    return reasons
