"""The delay relay (intellect/links.py) on loopback: every byte arrives, in order, at least the set delay
late in each direction (a floor, never faster), with jitter and 'loss' (held a retransmission timeout)
included; a relay with nothing behind it drops the connection; bad shapes are named."""

from __future__ import annotations

import os
import socket
import time

import pytest

from intellect.links import DelayRelay, LinkShape, parse_duration
from intellect.net import free_port
from tests.support.loopback import echo_server


def round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        started = time.perf_counter()
        conn.sendall(payload)
        got = bytearray()
        while len(got) < len(payload):
            chunk = conn.recv(65536)
            assert chunk, "the relay closed the connection early"
            got += chunk
        return bytes(got), time.perf_counter() - started


def test_every_byte_arrives_in_order_and_at_least_the_delay_late_each_way() -> None:
    server, port = echo_server()
    try:
        with DelayRelay(("127.0.0.1", port), LinkShape(0.05)) as relay:
            small, took = round_trip(relay.port, b"ping")
            assert small == b"ping" and took >= 0.1  # 50 ms there (client → echo) and 50 ms back
            big = os.urandom(3 * 1024 * 1024 + 7)  # many chunks
            echoed, _ = round_trip(relay.port, big)
            assert echoed == big
        with DelayRelay(("127.0.0.1", port), LinkShape(0.01, jitter=0.02, loss=0.2), seed=1) as shaky:
            data = os.urandom(1024 * 1024)
            echoed, took = round_trip(shaky.port, data)
            assert echoed == data and took >= 0.02  # jitter and retransmissions never reorder bytes
    finally:
        server.close()


def test_a_relay_with_nothing_behind_it_drops_the_connection() -> None:
    relay = DelayRelay(("127.0.0.1", free_port()), LinkShape(0.0)).start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as conn:
            conn.sendall(b"x")
            assert conn.recv(10) == b""
    finally:
        relay.stop()


def test_shapes_and_durations_are_checked() -> None:
    assert parse_duration("50ms") == pytest.approx(0.05) and parse_duration("0.1s") == pytest.approx(0.1)
    assert parse_duration("20") == pytest.approx(0.02)
    assert LinkShape.parse("50ms", "5ms", 0.01) == LinkShape(0.05, 0.005, 0.01)
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("fast")
    with pytest.raises(ValueError, match="loss < 1"):
        LinkShape(0.01, loss=1.0)


def test_the_relay_runs_as_a_program_and_stops_on_sigterm() -> None:
    import signal
    import subprocess
    import sys

    server, port = echo_server()
    listen = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "intellect.links", "--listen", f"127.0.0.1:{listen}",
                             "--target", f"127.0.0.1:{port}", "--delay", "20ms"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and "20 ms each way" in proc.stdout.readline()
        echoed, took = round_trip(listen, b"hello")
        assert echoed == b"hello" and took >= 0.04
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        server.close()
    bad = subprocess.run([sys.executable, "-m", "intellect.links", "--listen", "127.0.0.1:1", "--target",
                          "127.0.0.1:2", "--delay", "soon"], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "not a duration" in bad.stderr
