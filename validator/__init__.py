"""The validator: watches work submitted on the ledger, judges every rollout file, votes to slash cheaters."""
