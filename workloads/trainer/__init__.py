"""The trainer workload: GRPO on validated rollouts, one checkpoint per step, and the step counter."""
