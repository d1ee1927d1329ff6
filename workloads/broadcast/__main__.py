"""`python -m workloads.broadcast`: the same as `intellect-broadcast`."""

from workloads.broadcast.cli import main

main()
