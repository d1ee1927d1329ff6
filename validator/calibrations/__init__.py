"""Shipped calibration records (JSON, validator/calibration.py): one per model they were measured on."""
