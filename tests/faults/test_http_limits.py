"""Slow and oversized HTTP clients against a real worker: held connections are closed, big headers refused."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tests.integration.harness import make_worker, unique_config

pytestmark = pytest.mark.timeout(180)
HEADER_TIMEOUT_S = 4.0
MAX_CONNECTIONS = 300
SLOW_CLIENTS = 400


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return s


def answer(s: socket.socket, wait_s: float) -> bytes:
    """What the server sends before it closes, within wait_s (b"" if it closed without a word);
    raises TimeoutError if the connection is still held open then."""
    s.settimeout(wait_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our unread bytes in its buffer: a reset, after its answer
        return data or b"reset"
    return data


def test_slow_and_oversized_clients_are_cut_off(kafka, tmp_path: Path) -> None:
    """400 connections that never finish their headers are closed within the header timeout (408) and
    the worker's fds fall back; connections beyond the maximum get 503 at once; 100 headers of 8 KB are
    refused (431); a well-behaved client is answered throughout."""
    worker = make_worker(unique_config(kafka.bootstrap), tmp_path)
    worker.extra_env = {"LOOPWARDEN_HTTP_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                        "LOOPWARDEN_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
                        "LOOPWARDEN_HTTP_MAX_HEADER_BYTES": "32768"}
    worker.start()
    port, pid = worker.config.web_port, worker.proc.pid
    clients: list[socket.socket] = []
    try:
        baseline = fds(pid)
        began = time.monotonic()
        for _ in range(SLOW_CLIENTS):
            s = connect(port)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
            clients.append(s)
        opened = time.monotonic() - began
        time.sleep(0.5)
        held = fds(pid) - baseline
        print(f"\nslow clients: {SLOW_CLIENTS} opened in {opened:.2f} s, worker fds +{held} "
              f"(max connections {MAX_CONNECTIONS})")
        assert held <= MAX_CONNECTIONS + 5  # the ones beyond the maximum were not kept
        answers = [answer(s, HEADER_TIMEOUT_S + 5) for s in clients]  # TimeoutError: still held open
        took = time.monotonic() - began
        timed_out = sum(a.startswith(b"HTTP/1.1 408") for a in answers)
        refused = sum(a.startswith(b"HTTP/1.1 503") or a == b"reset" for a in answers)
        print(f"slow clients: {timed_out} closed with 408, {refused} refused with 503, all within {took:.1f} s")
        assert timed_out + refused == SLOW_CLIENTS and refused >= SLOW_CLIENTS - MAX_CONNECTIONS
        assert took <= HEADER_TIMEOUT_S + 4
        for s in clients:
            s.close()
        deadline = time.monotonic() + 5
        while fds(pid) > baseline + 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fds(pid) <= baseline + 3, (baseline, fds(pid))

        big = connect(port)
        filler = b"".join(b"X-Big-%d: %s\r\n" % (i, b"a" * 8000) for i in range(100))  # 800 KB of headers
        try:
            big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were still sending: the answer is read below
        reply = answer(big, 5)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
        big.close()

        assert worker.get("/healthz") == (200, b'{"status":"ok"}')  # a normal client is served
        keep = connect(port)  # two requests on one kept-alive connection, the second one slow but in time
        keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        time.sleep(HEADER_TIMEOUT_S / 2)
        keep.sendall(b"Connection: close\r\n\r\n")
        assert answer(keep, 5).count(b"HTTP/1.1 200") == 2
        keep.close()
    finally:
        for s in clients:
            s.close()
        worker.stop()
