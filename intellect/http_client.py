"""One HTTP client per process for the plain calls services and workloads make (step polls, file
and checkpoint fetches, the validator's task reads).

`httpx.get(...)` builds a new `httpx.Client` for every call, and each client builds an SSL context
(the CA bundle read and parsed) even for a plain-HTTP call on loopback: 27 ms of CPU per call on the
2-core devnet machine. Profiling `make devnet` (py-spy) put 12 % of a validator's samples there: its
watcher polls the trainer's step, and every file costs a grant and a download. One shared client
(thread-safe, built on first use) costs that once, and keeps connections alive between calls.
Per-call settings (timeout, auth, params, redirects) are given per request, as before.
"""

from __future__ import annotations

import threading

import httpx

_client: httpx.Client | None = None
_lock = threading.Lock()


def shared() -> httpx.Client:
    """This process's client (rebuilt if something closed it)."""
    global _client
    with _lock:
        if _client is None or _client.is_closed:
            _client = httpx.Client(timeout=30.0)
        return _client
