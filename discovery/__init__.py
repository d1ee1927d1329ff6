"""Discovery service: signed node metadata in Redis, checked on chain, served by access tier."""
