"""Intellect shared package: identity, request signing, wire models and settings.

Every service depends on this package and on nothing of another service's internals.
"""

__version__ = "0.1.0"
