"""The inference task's judged settings; they live with the inference workload now
(`workloads/inference/task.py`) and are chosen per file from the file's own task (`validator/tasks.py`)."""

from workloads.inference.task import ENV_PREFIX, TaskSettings

__all__ = ["ENV_PREFIX", "TaskSettings"]
