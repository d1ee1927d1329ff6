"""Checks 4–6: nothing is paid twice, every prompt and seed comes from the submitter's own plan,
and the file belongs to a step (and a checkpoint) the trainer still accepts."""

from __future__ import annotations

import hashlib
from typing import Any

from intellect.workloads import NodeWindows, judged_again
from workloads.inference.judge.checks.context import FileContext, rows_named
from workloads.inference.selection import plan_batch


def row_hash(input_tokens: list[int], output_tokens: list[int], seed: int) -> str:
    blob = ",".join(map(str, input_tokens)) + "|" + ",".join(map(str, output_tokens)) + "|" + str(seed)
    return hashlib.sha256(blob.encode()).hexdigest()


def duplicates(ctx: FileContext) -> list[str]:
    """Check 4: the file, any of its rows, or its (task, node, batch counter) seen before in the pool."""
    assert ctx.info is not None
    pool = ctx.submission.pool_id
    ctx.row_hashes = [row_hash(r.input_tokens, r.output_tokens, r.seed) for r in ctx.rows]
    # Per task: two tasks of one pool each have a batch 1 for the same node.
    ctx.plan_key = f"plan:{ctx.info.task_id}:{ctx.info.node_address.lower()}:{ctx.info.batch_counter}"
    if judged_again(ctx.seen, pool, ctx.sha256):  # its rows and counter are its own: nothing repeated
        return []
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
        reasons.append(f"duplicate: batch counter {ctx.info.batch_counter} was already used by this node")
    return reasons


def plan_derivation(ctx: FileContext) -> list[str]:
    """Check 5: prompts, seeds and target lengths are exactly the submitter's plan for its counter."""
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


HOLD = 8  # after a gap in a node's counters, its next HOLD counters are not paid either
# The first words of the hold's own reasons (a gap, a held counter): the only soft reasons that never
# forfeit a counter (`forfeit`), or a hold would extend itself for ever.
ORDER = "selection: batch counter "


def _keep() -> int:
    """Entries a node's counter window keeps: a hold's reach and the file before it (HOLD + 2 files),
    each with room for its forfeit mark."""
    return 2 * (HOLD + 2)


def _entry(ctx: FileContext) -> tuple[str, dict[str, Any]]:
    """The window (pool, node and task) and this file's entry in it."""
    assert ctx.info is not None
    info = ctx.info
    node = (ctx.submission.node or info.node_address).lower()
    entry = {"file": ctx.sha256, "counter": info.batch_counter, "skipped": ctx.submission.counters_unknown,
             "step": info.step, "checkpoint_step": info.checkpoint_step}  # fmt: skip
    return f"{node}#{info.task_id}", entry


def _files(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A window's files, oldest first, each once (a file judged again counts where it was first
    judged), with the forfeit of its latest judgment: a plain entry starts a judgment, a mark ends it."""
    files: dict[Any, dict[str, Any]] = {}
    for item in window:
        key = item.get("file")
        if key not in files:
            files[key] = dict(item)
        elif item.get("forfeit"):
            files[key]["forfeit"] = item["forfeit"]
        else:  # judged again: what this judgment finds replaces the last one's
            files[key].pop("forfeit", None)
    return list(files.values())


def counter_order(ctx: FileContext, windows: NodeWindows) -> list[str]:
    """Selection: a node's batches are paid only as the plan orders them, so it cannot choose which of
    the batches it made are trained on (docs/validator.md, "Selection").

    - Counters run 1, 2, 3, ... over the whole task, across steps (the plan is (task, node, counter):
      workloads/inference/selection.py), judged in chain order (the judge loop holds a node's file
      until its earlier ones have verdicts). A counter past the next one is a gap: a batch the node
      made (or may have made) and withheld. The file is not paid, and neither are the node's next
      HOLD counters: a node that withholds a bad batch forfeits nine more, so withholding never pays
      (it is paid for a seventh of what it made: bench/selection.py). Soft (never
      slashed): an honest worker can leave a gap (an upload refused for good), and the count goes on
      after the hold.
    - A counter used but not judged on its merits counts as a withheld batch (`forfeit`): a file
      soft-invalidated for anything the node can cause (a stale step label, a checkpoint the trainer
      never had, a label or checkpoint that goes back, a marginal or uncalibrated recomputation) holds
      the node's next file and the HOLD after it, or a node would drop a batch by labelling it stale
      instead of withholding it.
    - A file the validator never read because storage stayed unreachable (`Submission.counters_unknown`:
      soft, "fetch:") may have used the counters up to this file's: that many are allowed skipped, and
      no hold follows. Only storage counts there (validator/store.py `unread_before`), which a node
      cannot make unreachable; a file the node made bigger than the validator reads is a verdict of its
      own ("size:", validator/judging.py), not an unread one, so the file after it is a gap and held.
      Storage losing a file costs an honest node that file alone (the design: nothing of the judge's
      environment counts against a node).
    - A node's step labels and checkpoints do not go back: a label only chooses the checkpoint that
      generated a batch (the plan has no step), and a node free to go back could make its next batch
      with each checkpoint of the async window and submit the best. Soft too: an honest node's
      checkpoint can go back once (a restart, a relay that lost the newest), which is then unpaid
      (and, a soft reason the node caused, counts as a withheld batch).

    Every submitted file whose header can be read counts, whatever its verdict: the pipeline calls
    this before any other check can fail (counting only accepted files made the node's next honest
    file look like a gap). A file judged again (a retry after an error of the validator's) is not
    counted twice: the window names each entry's file."""
    assert ctx.info is not None
    info = ctx.info
    key, entry = _entry(ctx)
    window = windows.push(ctx.submission.pool_id, key, entry, keep=_keep())
    files = [f for f in _files(window) if f.get("file") != ctx.sha256] + [entry]
    if len(window) < _keep():  # the node's whole history is here: it starts from counter 0
        files.insert(0, {"counter": 0})
    held_until, cause, reasons = 0, "", []
    for before, item in zip(files, files[1:], strict=False):
        at, after, unread = int(item["counter"]), int(before["counter"]), int(item.get("skipped", 0))
        # Each hold: (the last counter held, why). A withheld batch holds the next file (the gap) and
        # the HOLD after it; a file never read, or a counter forfeited, counts as a withheld batch.
        as_withheld = f"which counts as a withheld batch: the next file and the {HOLD} after it are not paid"
        holds = []
        if at > after + 1 + unread:
            holds.append((at + HOLD, f"a gap in this node's counters is followed by {HOLD} unpaid ones"))
        if item.get("forfeit") and item is not entry:
            holds.append((at + 1 + HOLD, f"counter {at} was not judged on its merits ({item['forfeit']}), "
                          f"{as_withheld}"))  # fmt: skip
        for until, why in holds:
            if until > held_until:
                held_until, cause = until, why
    previous = files[-2] if len(files) > 1 else {"counter": 0}
    counter, skipped = info.batch_counter, ctx.submission.counters_unknown
    if not int(previous["counter"]) + 1 <= counter <= int(previous["counter"]) + 1 + skipped:
        due = int(previous["counter"]) + 1
        due_text = f"{due}" if not skipped else f"{due} to {due + skipped}"
        reasons.append(f"{ORDER}{counter} where {due_text} was due (a node's counters follow each other "
                       f"over the task; after a gap its next {HOLD} are not paid)")  # fmt: skip
    elif counter <= held_until:
        reasons.append(f"{ORDER}{counter} is held: {cause} (paid again from counter {held_until + 1})")
    labels = [int(f["step"]) for f in files[:-1] if f.get("step") is not None]
    if labels and info.step < max(labels):
        reasons.append(f"selection: step label {info.step} after this node's label {max(labels)} (a "
                       "node's labels do not go back)")  # fmt: skip
    used = [int(f["checkpoint_step"]) for f in files[:-1] if f.get("checkpoint_step") is not None]
    mine = info.checkpoint_step
    if used and mine is not None and mine < max(used):
        reasons.append(f"selection: checkpoint of step {mine} after this node's checkpoint of step "
                       f"{max(used)} (a node's checkpoints do not go back)")  # fmt: skip
    return reasons


def _why(reason: str) -> str:
    """A soft reason in a few words, for the sentences of the hold it starts."""
    for start, short in (
        ("freshness: step", "stale step label"),
        ("freshness: no checkpoint", "a checkpoint the trainer does not have"),
        ("selection: step label", "its step label went back"),
        ("selection: checkpoint", "its checkpoint went back"),
    ):
        if reason.startswith(start):
            return short
    text = reason.split(" [", 1)[0]
    text = text if len(text) <= 80 else text[:79] + "…"
    if "[marginal" in reason:
        return f"a marginal recomputation: {text}"
    if "[no calibration" in reason:
        return f"a recomputation failure on an uncalibrated model: {text}"
    return f"soft: {text}"


def forfeit(ctx: FileContext, windows: NodeWindows, reasons: list[str]) -> str | None:
    """A file whose counter is used (`counter_order` ran) but that is not paid on its merits: its
    soft reasons `reasons`. Unless they are only the hold's own (a gap, a held counter: a hold must
    not extend itself), the counter is forfeited: marked in the node's counter window, where
    `counter_order` counts it as a withheld batch (the next file and the HOLD after it are held), so a
    node cannot cause such a reason to drop a batch for free (a stale label, a checkpoint the trainer
    never had, a label or checkpoint that goes back, a marginal or uncalibrated recomputation, ...). The
    validator's own trouble (file missing, unreadable, too big, another sha256) never gets here:
    `file_identity` refuses it before the counter is read. Returns why in a few words (None: not
    forfeited); the held files' reasons say it ("selection: batch counter 7 is held: counter 5 was
    not judged on its merits (stale step label) ..."), the file's own verdict keeps its own reasons.
    Judged again, a file's latest judgment replaces its mark (`_files`): it counts once."""
    if ctx.info is None:
        return None
    own = [r for r in reasons if not r.startswith(ORDER)]
    if not own:
        return None
    why = _why(own[0])
    key, entry = _entry(ctx)
    windows.push(ctx.submission.pool_id, key, {**entry, "forfeit": why}, keep=_keep())
    return why


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
    - the checkpoint it names can no longer be had from the trainer, which keeps every checkpoint that
      files awaiting judgement may name until their vote window has passed (docs/trainer.md,
      "Checkpoints kept for the judges"): an honest file meets this only where the trainer is gone.
    A node can cause both (a stale label, a checkpoint the trainer never had), so such a file's
    counter is forfeited (`forfeit`: it counts as a withheld batch), or a node would drop a batch by
    labelling it so instead of withholding it."""
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
