"""The RL inference workload: rollouts with TOPLOC proofs (`python -m workloads.inference`)."""
