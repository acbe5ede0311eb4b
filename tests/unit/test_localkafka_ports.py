"""The dev broker's port check: a port held only by TIME_WAIT connections is free, a listening one is not."""

from __future__ import annotations

import socket

from dev.localkafka import HOST, port_free


def _time_wait_port() -> int:
    """A port whose only trace is a connection in TIME_WAIT, as after a broker SIGKILL (the server closed first)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((HOST, 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection((HOST, port))
    conn, _ = server.accept()
    server.close()
    conn.close()  # the server side closes first: its end of the connection stays in TIME_WAIT on `port`
    client.recv(1)
    client.close()
    return port


def test_a_port_in_time_wait_is_free_for_a_new_broker() -> None:
    port = _time_wait_port()
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        plain.bind((HOST, port))  # without SO_REUSEADDR Linux refuses: what the old check saw for ~60 s
        refused_without_reuse = False
    except OSError:
        refused_without_reuse = True
    finally:
        plain.close()
    assert refused_without_reuse
    assert port_free(port)


def test_a_listening_port_is_taken() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((HOST, 0))
        listener.listen()
        assert not port_free(listener.getsockname()[1])
