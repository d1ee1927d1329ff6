"""Intellect shared package: identity, request signing, wire models and settings.

Every service depends on this package and on nothing of another service's internals.
"""

__version__ = "0.1.0"

from intellect.logs import default_to_stderr as _default_to_stderr  # noqa: E402

_default_to_stderr()
