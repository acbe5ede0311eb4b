"""A local Kafka broker with a SASL_SSL listener for the secure-connection tests: a CA and a server
certificate made here (cryptography), SCRAM users created by the broker's own storage tool at format
time, and a PLAINTEXT listener beside it for the tests' own checks."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from dev.localkafka import HOST, LocalKafka, free_port

USERS = {"SCRAM-SHA-256": ("alice", "alice-secret-256"), "SCRAM-SHA-512": ("bob", "bob-secret-512")}


def _key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_ca(name: str):
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca_key, ca_cert, name: str, *, server: bool):
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2)))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


@dataclass
class SecureBroker:
    kafka: LocalKafka
    plain: str  # PLAINTEXT listener, for the tests' own reads
    secure: str  # SASL_SSL listener
    ca_file: Path
    other_ca_file: Path  # a CA that did not sign the broker's certificate


def start_secure_broker(work: Path) -> SecureBroker:
    work.mkdir(parents=True, exist_ok=True)
    ca_key, ca = make_ca("loopwarden test CA")
    _, other = make_ca("some other CA")
    key, cert = make_leaf(ca_key, ca, "localhost", server=True)
    (work / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (work / "other-ca.pem").write_bytes(other.public_bytes(serialization.Encoding.PEM))
    server_pem = work / "server.pem"  # Kafka's PEM key store: the private key, then the chain
    server_pem.write_bytes(_pem_key(key) + cert.public_bytes(serialization.Encoding.PEM)
                           + ca.public_bytes(serialization.Encoding.PEM))
    port, cport = free_port(), None
    cport = free_port(exclude=(port,))
    sport = free_port(exclude=(port, cport))
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    overrides = {
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{cport},SECURE://{HOST}:{sport}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port},SECURE://{HOST}:{sport}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.secure.scram-sha-256.sasl.jaas.config": scram,
        "listener.name.secure.scram-sha-512.sasl.jaas.config": scram,
        "listener.name.secure.ssl.keystore.type": "PEM",
        "listener.name.secure.ssl.keystore.location": str(server_pem),
    }
    format_args = []
    for mechanism, (user, password) in USERS.items():
        format_args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    kafka = LocalKafka(work / "kafka", port=port, controller_port=cport, heap="512m", overrides=overrides,
                       format_args=format_args).start(timeout_s=120)
    return SecureBroker(kafka, f"{HOST}:{port}", f"{HOST}:{sport}", work / "ca.pem", work / "other-ca.pem")
