"""`intellect-train` (or `python -m workloads.trainer`): the trainer workload.

Trains with GRPO on validated rollouts and serves the step counter and checkpoints over HTTP.
Configured by flags, `INTELLECT_TRAIN_*` environment variables and `.env`; `--cpu-demo` applies the
tiny-model overrides (see `TrainerSettings.for_cpu_demo`).

A bad start is refused before the model loads, in one line and a non-zero exit: invalid settings or
`--rollouts` neither a URL nor a folder (2), a step-counter port already taken (1). A trainer that
trained on without its step counter would write checkpoints no worker is ever told about.

After `--max-steps` the trainer stops training but serves on (step counter and checkpoints) until its
last files can no longer be judged: `--vote-window-seconds` after both its last step and the last
request for a step or a checkpoint (`step_counter.linger`); SIGTERM or Ctrl-C ends it at once, and
`--vote-window-seconds 0` stops at the last step as before.

`--nproc N` (N > 1) shards the policy over N processes on this machine: the command checks its
settings and port, then hands itself to torchrun's elastic agent (`python -m torch.distributed.run
--standalone`), which starts N ranks of this same program, stops them all when one fails (or restarts
them, `--max-restarts`) and forwards SIGTERM. Why the agent and not processes of our own: it is
PyTorch's, it owns the rendezvous a multi-machine run needs, and the same ranks start unchanged under
a `torchrun --nnodes M ... -m workloads.trainer` an operator runs across machines (docs/trainer.md).
Rank 0 serves the step counter and publishes; the others only train (workloads/trainer/sharded.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliApp

from intellect.device import resolve_device
from intellect.http_server import bind_listener, server_options
from intellect.logs import configure_logging
from workloads.trainer.checkpoints import SUBMISSION_GRACE_SECONDS
from workloads.trainer.loop import Trainer
from workloads.trainer.settings import TrainerSettings
from workloads.trainer.sources import RolloutSource, source_for
from workloads.trainer.step_counter import create_app, linger


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        base = CliApp.run(TrainerSettings, cli_args=args)
        given = base.model_dump(exclude_unset=True)
        settings = TrainerSettings.for_cpu_demo(**given) if base.cpu_demo else base
        source = source_for(settings.rollouts, settings.output_dir, settings.pool_id)
    except ValidationError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ranked = int(os.environ.get("WORLD_SIZE", "1")) > 1  # one of torchrun's ranks
    if not ranked and settings.nproc > 1:
        return launch(settings, args)
    if ranked and os.environ.get("RANK") != "0":
        return follow(settings, source)
    try:
        listener = bind_listener(settings.host, settings.port)
    except OSError as exc:
        where = f"{settings.host}:{settings.port}"
        print(f"error: cannot serve the step counter on {where}: {exc.strerror or exc} (another trainer "
              "running? pick another --port)", file=sys.stderr)  # fmt: skip
        return 1
    settings = settings.model_copy(update={"port": listener.getsockname()[1]})
    configure_logging()
    trainer = sharded(settings, source) if ranked else Trainer(settings, source)
    app = create_app(trainer)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                           log_level="warning", **server_options()))  # fmt: skip
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True,
                              name="step-counter")  # fmt: skip
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"trainer at step {trainer.step}; step counter on {trainer.public_url}/step", flush=True)
    try:
        trainer.run(stop.is_set)
        if settings.vote_window_seconds and not stop.is_set():
            window = settings.vote_window_seconds + SUBMISSION_GRACE_SECONDS
            print(f"trainer took its last step ({trainer.step}); serving its checkpoints until nobody has "
                  f"asked for {window:.0f} s (files made for them may still be judged)", flush=True)
            linger(trainer.checkpoints, lambda: float(app.state.last_asked), window, stop)
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        trainer.close()
    return 0


def launch(settings: TrainerSettings, args: list[str]) -> int:
    """Hand this command to torchrun's elastic agent with N ranks of itself (the process is replaced:
    its pid, signals and exit status are the agent's). The step counter's port is checked, and a free
    one chosen for `--port 0`, before the ranks load anything."""
    try:
        probe = bind_listener(settings.host, settings.port)
    except OSError as exc:
        print(f"error: cannot serve the step counter on {settings.host}:{settings.port}: "
              f"{exc.strerror or exc} (another trainer running? pick another --port)",
              file=sys.stderr)  # fmt: skip
        return 1
    port = probe.getsockname()[1]
    probe.close()
    device = resolve_device(settings.device)
    if device.type == "cuda" and torch.cuda.device_count() < settings.nproc:
        print(f"error: --nproc {settings.nproc} on {device}: one GPU a rank, and {torch.cuda.device_count()} "
              "are visible (lower --nproc, or --device cpu)", file=sys.stderr)  # fmt: skip
        return 2
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={settings.nproc}", f"--max-restarts={settings.max_restarts}",
               "-m", "workloads.trainer", "--", *args, f"--port={port}"]  # fmt: skip
    print(f"trainer: {settings.nproc} ranks under torchrun (step counter on {settings.host}:{port})",
          flush=True)  # fmt: skip
    os.execv(sys.executable, command)
    return 1  # not reached: execv replaces the process or raises


def sharded(settings: TrainerSettings, source: RolloutSource) -> Trainer:
    """This process as its rank of the group (a RankError names what is missing: a GPU, torchrun)."""
    from workloads.trainer.ranks import join  # noqa: PLC0415 (torch.distributed only for ranks)
    from workloads.trainer.sharded import ShardedTrainer  # noqa: PLC0415

    ranks = join(resolve_device(settings.device), settings.collective_timeout_seconds)
    return ShardedTrainer(settings, source, ranks)


def follow(settings: TrainerSettings, source: RolloutSource) -> int:
    """A rank other than 0: trains its shard of every step rank 0 plans, serves nothing, and stops when
    rank 0 says so (its own SIGTERM waits for that: leaving mid-step would fail the others)."""
    configure_logging()
    signal.signal(signal.SIGTERM, lambda *_: None)
    trainer = sharded(settings, source)
    try:
        trainer.run()
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
