"""`python -m workloads.pipeline`: the pipeline workload's one program, one member of a group per process.

    python -m workloads.pipeline task                        # a worker's task: settings from the env
    python -m workloads.pipeline --index I --members N ...   # told everything by flags (--help)

`task` is how a worker runs it (the plug-in renders tasks so): the member's settings and the group's
place come as `INTELLECT_PIPELINE_*` variables and each batch becomes a file for the chain
(`workload.py`). By flags it runs outside any task, for local groups, benches and by hand, and writes
what it made as JSON (`standalone.py`). Both run the same `Member` (`member.py`).
"""

from __future__ import annotations

import sys

TASK = "task"  # the mode a worker runs (`plugin.ENTRYPOINT`)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [TASK]:
        if args[1:]:
            print(f"error: `{TASK}` takes no arguments (its settings are INTELLECT_PIPELINE_* variables): "
                  f"{' '.join(args[1:])}", file=sys.stderr)  # fmt: skip
            return 2
        from workloads.pipeline.workload import main as run_task

        return run_task()
    from workloads.pipeline.standalone import main as run_standalone

    return run_standalone(args)


if __name__ == "__main__":
    sys.exit(main())
