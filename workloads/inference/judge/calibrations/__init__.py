"""Shipped calibration records (JSON, workloads/inference/judge/calibration.py): one per model they were
measured on."""
