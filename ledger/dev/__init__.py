"""Development-only ledger parts: a local anvil chain for tests, the devnet and benches. Nothing a
service runs in production imports this package."""
