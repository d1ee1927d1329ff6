"""The discovery HTTP API: `deps` (dependencies read from `app.state`) and `routes` (one router per
resource). `discovery.server.create_app` assembles them; see docs/orchestrator.md for the contract."""
