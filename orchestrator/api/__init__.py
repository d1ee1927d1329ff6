"""The orchestrator's HTTP API: `deps` (dependencies read from `app.state`) and `routes` (one router per
resource). `orchestrator.server.create_app` assembles them; see docs/orchestrator.md for the contract."""
