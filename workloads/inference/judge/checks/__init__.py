"""The checks a validator runs on one rollout file, cheapest first. Each is a function of the
`FileContext` that returns the reasons it fails (empty: passed); see
`workloads/inference/judge/file_judge.py`."""
