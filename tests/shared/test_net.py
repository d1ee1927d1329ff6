"""Ports for listeners that come and go (intellect.net.stable_port): never one the kernel hands out
itself, so no outgoing connection or port-0 bind can hold it while its owner is down."""

from __future__ import annotations

import socket

from intellect.net import _bindable, ephemeral_range, free_port, stable_port


def test_a_stable_port_and_its_span_are_free_and_below_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    assert 1024 <= low < high
    for _ in range(50):
        port = stable_port(span=2)
        assert port >= 1024 and port + 1 < low
        for p in (port, port + 1):
            with socket.socket() as sock:
                sock.bind(("0.0.0.0", p))  # no SO_REUSEADDR: nothing else holds it


def test_a_port_held_by_an_outgoing_connection_is_not_bindable() -> None:
    """Why free_port is wrong for a listener bound again later: the local end of an outgoing
    connection takes an ephemeral port, and a listener's bind to it fails while it lives."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            taken = client.getsockname()[1]
            assert ephemeral_range()[0] <= taken <= ephemeral_range()[1]
            assert not _bindable("0.0.0.0", taken)
        port = free_port()
        assert _bindable("0.0.0.0", port)
