"""`python -m intellect_arith`: what a worker runs for an `arith` task.

Reads its settings from `INTELLECT_ARITH_*` (the plug-in's `render` put them there) and who and where
it is from the worker (`INTELLECT_TASK_ID`, `INTELLECT_NODE_ADDRESS`, `INTELLECT_DATA_DIR`); writes
`files` answer files into the data dir and announces each on the worker's bridge (the worker uploads
it and submits it on chain for its problem count), then exits. Restarted after a failure, it
announces the files it had written again (the worker keeps one upload per content) and writes the
rest. Outside a worker (no `INTELLECT_SOCKET_PATH`) it only writes the files.

`INTELLECT_ARITH_CHEAT=wrong-answer` makes a cheater's files (one answer off): demos and tests only,
injected by a misbehaving operator's worker (`INTELLECT_WORKER_TASK_ENV`), never by a task.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from intellect_arith.plugin import ENV_PREFIX, ArithSettings
from intellect_arith.problems import write_file


def settings_from_env(env: dict[str, str]) -> ArithSettings:
    values = {name: env[ENV_PREFIX + name.upper()] for name in ArithSettings.model_fields
              if ENV_PREFIX + name.upper() in env}  # fmt: skip
    return ArithSettings.model_validate(values)


def main() -> int:
    env = dict(os.environ)
    settings = settings_from_env(env)
    task_id = env.get("INTELLECT_TASK_ID", "local")
    node = env.get("INTELLECT_NODE_ADDRESS", "0x" + "0" * 39 + "1")
    out = Path(env.get("INTELLECT_DATA_DIR", "arith-out"))
    out.mkdir(parents=True, exist_ok=True)
    wrong = env.get(ENV_PREFIX + "CHEAT", "none") == "wrong-answer"
    for counter in range(1, settings.files + 1):
        path = out / f"arith-{node.lower()}-{counter}.json"
        if not path.exists():  # a restarted run (data kept) never solves a counter twice (a repeat)
            write_file(path, task_id, node, counter, settings.problems, settings.digits, wrong=wrong)
        if env.get("INTELLECT_SOCKET_PATH"):
            from workloads.bridge_client import announce_file  # the bridge's client, shipped with intellect

            announce_file(path, work_units=settings.problems)
        print(json.dumps({"file": str(path), "problems": settings.problems}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
