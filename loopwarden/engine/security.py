"""How every Kafka client of the project connects: TLS and SASL settings from the EngineConfig.

One function, :func:`client_options`, gives the keyword arguments that aiokafka's consumer,
producer and admin client take (``bootstrap_servers``, ``security_protocol``, an SSL context,
the SASL mechanism and credentials); the worker, ``simulate``, ``tail``, ``tick`` and the
topic creator all pass them, so a setting applies to every connection.

Supported: PLAINTEXT, SSL (optionally with a client certificate: mutual TLS), SASL_PLAINTEXT
and SASL_SSL with PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. OAUTHBEARER needs a token provider
object in aiokafka (code, not a setting), so it is not offered as a setting.
"""

from __future__ import annotations

import ssl

from loopwarden.engine.exceptions import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def ssl_context(cafile: str | None, certfile: str | None, keyfile: str | None, check_hostname: bool) -> ssl.SSLContext:
    """A client TLS context: the CA file (else the system's CAs), an optional client certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if cafile:
        try:
            ctx.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ssl_cafile: {cafile!r} cannot be used as a CA bundle ({exc})") from None
    if certfile:
        try:
            ctx.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ssl_certfile: {certfile!r} (ssl_keyfile: {keyfile!r}) cannot be used as a client "
                              f"certificate and key ({exc})") from None
    ctx.check_hostname = check_hostname
    return ctx


def client_options(config) -> dict:
    """Keyword arguments for aiokafka's clients (consumer, producer, admin) from an EngineConfig."""
    opts: dict = {"bootstrap_servers": config.broker, "security_protocol": config.security_protocol}
    if "SSL" in config.security_protocol:
        opts["ssl_context"] = ssl_context(config.ssl_cafile, config.ssl_certfile, config.ssl_keyfile,
                                          config.ssl_check_hostname)
    if config.security_protocol.startswith("SASL"):
        opts.update(sasl_mechanism=config.sasl_mechanism, sasl_plain_username=config.sasl_username,
                    sasl_plain_password=config.sasl_password)
    return opts


def check(config) -> None:
    """Refuse settings that cannot work together, naming them (called by EngineConfig)."""
    p = config.security_protocol
    if p not in PROTOCOLS:
        raise ConfigError(f"security_protocol: {p!r} must be one of {', '.join(PROTOCOLS)}")
    if p.startswith("SASL"):
        if config.sasl_mechanism not in MECHANISMS:
            raise ConfigError(f"sasl_mechanism: {config.sasl_mechanism!r} must be one of {', '.join(MECHANISMS)} "
                              f"with security_protocol={p}")
        if not config.sasl_username or not config.sasl_password:
            raise ConfigError(f"security_protocol={p} needs sasl_username and sasl_password")
    else:
        for name in ("sasl_mechanism", "sasl_username", "sasl_password"):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} is set but security_protocol={p} does not use SASL (use SASL_SSL or SASL_PLAINTEXT)")
    if "SSL" not in p:
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} is set but security_protocol={p} does not use TLS (use SSL or SASL_SSL)")
    if config.ssl_keyfile is not None and config.ssl_certfile is None:
        raise ConfigError("ssl_keyfile is set without ssl_certfile (the client certificate)")
    if "SSL" in p:
        ssl_context(config.ssl_cafile, config.ssl_certfile, config.ssl_keyfile, config.ssl_check_hostname)
