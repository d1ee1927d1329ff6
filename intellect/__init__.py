"""Intellect shared package: identity, request signing, wire models and settings.

Every service depends on this package and on nothing of another service's internals. Logging is set
up by each entry point (`intellect.logs.setup_logging`), never here. The one thing importing it does:
`py_ecc` (imported by eth-account, which every service uses) raises the interpreter's recursion limit
to 100,000 at import, so that C-level recursion (the JSON decoder on a deeply nested body) overflows
the C stack and kills the process before Python's guard trips. The limit is put back to a sane value
here, after importing py_ecc first, so the guard works in every process that uses this package.
"""

import sys as _sys

import py_ecc as _py_ecc  # noqa: F401 - imported for its side effect, undone below

SANE_RECURSION_LIMIT = 3000
if _sys.getrecursionlimit() > SANE_RECURSION_LIMIT:
    _sys.setrecursionlimit(SANE_RECURSION_LIMIT)

__version__ = "0.1.0"
