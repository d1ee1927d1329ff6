"""The contributor's worker: registration, discovery upload, invite API, heartbeats, runtimes."""

__version__ = "0.1.0"
