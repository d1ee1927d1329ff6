"""One thin wrapper per deployed contract, each over the shared plumbing in `base.ContractBase`
(connection, wallet, transaction sender, log decoding). Split by contract so a reader finds every
call to, say, `ComputeRegistry` in one file; `ledger.client.LedgerClient` composes them all and is
what callers import."""
