"""Checkpoint broadcast: trainer checkpoints from one origin, through relays, to many inference workers.

Modules: `manifest` (what a version is), `store` (versions on disk), `api` (the HTTP face shared by
origin and relay), `origin` (publish + watch the trainer), `relay` (mirror an upstream, pipelined),
`client` (concurrent, verified download into one file), `shardcast_compat` (read a shardcast 0.3.2
origin), `cli` (`intellect-broadcast`). Importing the package loads none of them: the client must stay
small in memory, so it never pays for FastAPI.
"""
