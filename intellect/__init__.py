"""Intellect shared package: identity, request signing, wire models and settings.

Every service depends on this package and on nothing of another service's internals. Importing it
has no side effect: logging is set up by each entry point (`intellect.logs.setup_logging`).
"""

__version__ = "0.1.0"
