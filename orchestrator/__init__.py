"""Orchestrator: node lifecycle (invites, heartbeats, liveness), task API and scheduling."""
