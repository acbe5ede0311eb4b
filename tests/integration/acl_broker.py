"""A local Kafka broker that enforces ACLs (KRaft's StandardAuthorizer), for the trusted-channel tests.

Listeners: SASL_PLAINTEXT with SCRAM-SHA-256 users made by the storage tool at format time (``admin``, a
super user, for the worker; ``verifier``; ``agent``), and a PLAINTEXT listener for the tests' own reads and
for the controller, whose principal (``User:ANONYMOUS``) is a super user too: in this one-node cluster the
broker reaches its controller through it. ACLs are created as an operator's ``kafka-acls.sh`` would, with a
CreateAcls request (v1) on the PLAINTEXT listener (no Kafka tools jar is needed for it).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from dev.localkafka import HOST, LocalKafka, free_port

MECHANISM = "SCRAM-SHA-256"
USERS = {"admin": "admin-secret", "verifier": "verifier-secret", "agent": "agent-secret"}
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

# Kafka's AclBinding codes (org.apache.kafka.common.acl / resource)
TOPIC, GROUP = 2, 3
LITERAL, PREFIXED = 3, 4
READ, WRITE, DESCRIBE = 3, 4, 8
ALLOW = 3


@dataclass
class AclBroker:
    kafka: LocalKafka
    plain: str  # PLAINTEXT listener: super user (the tests' own reads and writes)
    sasl: str  # SASL_PLAINTEXT listener: admin, verifier, agent

    def create_acls(self, acls: list[tuple[int, str, int, str, int]]) -> None:
        """Allow each ``(resource type, name, pattern type, principal, operation)``; raises on an error."""
        body = struct.pack(">i", len(acls))
        for rtype, name, pattern, principal, op in acls:
            body += struct.pack(">b", rtype) + _string(name) + struct.pack(">b", pattern)
            body += _string(principal) + _string("*") + struct.pack(">bb", op, ALLOW)
        host, port = self.plain.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.settimeout(10)
            resp = _call(sock, 30, 1, body)  # CreateAcls v1
        (_throttle, n) = struct.unpack(">ii", resp[:8])
        off, errors = 8, []
        for i in range(n):
            (code, mlen) = struct.unpack(">hh", resp[off:off + 4])
            off += 4
            message = resp[off:off + mlen].decode() if mlen > 0 else ""
            off += max(mlen, 0)
            if code:
                errors.append(f"{acls[i]}: error {code} {message}")
        if errors:
            raise RuntimeError("CreateAcls failed: " + "; ".join(errors))


def _call(sock: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    """One request with header v1 (a non-flexible version); the response body."""
    client = b"loopwarden-tests"
    msg = struct.pack(">hhih", api_key, version, 1, len(client)) + client + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    size = struct.unpack(">i", _recv(sock, 4))[0]
    return _recv(sock, size)[4:]  # past the correlation id


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return buf


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def start_acl_broker(work: Path) -> AclBroker:
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cport = free_port(exclude=(port,))
    sport = free_port(exclude=(port, cport))
    overrides = {
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{cport},SASL://{HOST}:{sport}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port},SASL://{HOST}:{sport}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        "listener.name.sasl.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:ANONYMOUS;User:admin",
        "allow.everyone.if.no.acl.found": "false",
        "auto.create.topics.enable": "false",
    }
    format_args = []
    for user, password in USERS.items():
        format_args += ["--add-scram", f"{MECHANISM}=[name={user},password={password}]"]
    kafka = LocalKafka(work / "kafka", port=port, controller_port=cport, heap="512m", overrides=overrides,
                       format_args=format_args).start(timeout_s=120)
    return AclBroker(kafka, f"{HOST}:{port}", f"{HOST}:{sport}")
