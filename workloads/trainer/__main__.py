"""`intellect-train` (or `python -m workloads.trainer`): the trainer workload.

Trains with GRPO on validated rollouts and serves the step counter and checkpoints over HTTP.
Configured by flags, `INTELLECT_TRAIN_*` environment variables and `.env`; `--cpu-demo` applies the
tiny-model overrides (see `TrainerSettings.cpu_demo`).
"""

from __future__ import annotations

import signal
import sys
import threading

import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliApp

from intellect.logs import configure_logging
from intellect.net import free_port
from workloads.trainer.loop import Trainer
from workloads.trainer.settings import TrainerSettings
from workloads.trainer.sources import source_for
from workloads.trainer.step_counter import create_app


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    demo = "--cpu-demo" in args
    args = [a for a in args if a != "--cpu-demo"]
    try:
        base = CliApp.run(TrainerSettings, cli_args=args)
        settings = TrainerSettings.cpu_demo(**base.model_dump(exclude_unset=True)) if demo else base
    except ValidationError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    if settings.port == 0:
        settings = settings.model_copy(update={"port": free_port()})
    configure_logging()
    source = source_for(settings.rollouts, settings.output_dir, settings.pool_id)
    trainer = Trainer(settings, source)
    server = uvicorn.Server(uvicorn.Config(create_app(trainer), host=settings.host, port=settings.port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True, name="step-counter")
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"trainer at step {trainer.step}; step counter on {trainer.public_url}/step", flush=True)
    try:
        trainer.run(stop.is_set)
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
