"""Whether the trusted receipts topic can be trusted: the cluster must have an authorizer.

Receipts on ``trusted_outcomes_topic`` count without a signature check because only the verifiers'
principals may write that topic, and that is the cluster's ACLs' doing (docs/receipts.md gives the
``kafka-acls.sh`` commands). aiokafka's admin client has no DescribeAcls (0.14: no ``describe_acls``;
its protocol classes are not a public API), so the worker cannot read the topic's ACLs. What it can
read, with ``describe_configs``, is each broker's ``authorizer.class.name``: with none, every client
may write every topic, and a receipt there proves nothing. Then the worker refuses to start, unless
``trusted_outcomes_without_acl`` says the operator accepts it (single-tenant dev, the bench). With
``allow.everyone.if.no.acl.found=true`` a topic without ACLs is open too: said as a warning, since
only the ACLs themselves (which it cannot read) tell whether this topic has some.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from loopwarden.engine.config import env_name
from loopwarden.stages.health.config import HealthConfig
from loopwarden.engine.exceptions import UntrustedChannelError
from loopwarden.engine.security import client_options

log = logging.getLogger("loopwarden.acl")
_KEYS = ("authorizer.class.name", "allow.everyone.if.no.acl.found")


@dataclass(frozen=True)
class Authorizer:
    """What the brokers say about authorization; ``error``: why they could not be asked (else None)."""

    brokers: dict[int, str]  # broker id -> authorizer.class.name ("" when none)
    allow_everyone: dict[int, bool]  # broker id -> allow.everyone.if.no.acl.found
    error: str | None = None

    @property
    def enforced(self) -> bool:
        """Every broker has an authorizer (so ACLs decide who writes a topic)."""
        return bool(self.brokers) and all(self.brokers.values())

    def describe(self) -> str:
        if self.error:
            return f"unknown ({self.error})"
        names = sorted(set(self.brokers.values()))
        shown = ", ".join(n or "none" for n in names)
        open_ = " (allow.everyone.if.no.acl.found=true: a topic with no ACL is open)" if any(
            self.allow_everyone.values()) else ""
        return f"{shown}{open_}"


async def read_authorizer(config: HealthConfig, timeout_s: float = 30) -> Authorizer:
    """Each broker's authorizer and allow.everyone.if.no.acl.found (never fails: ``error`` says why not)."""
    admin = AIOKafkaAdminClient(**client_options(config), request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        ids = [b["node_id"] for b in cluster["brokers"]]
        answers = await admin.describe_configs([
            ConfigResource(ConfigResourceType.BROKER, str(i), dict.fromkeys(_KEYS)) for i in ids])
    except Exception as exc:  # noqa: BLE001 - no DescribeConfigs permission, an old broker: said, not fatal here
        return Authorizer({}, {}, f"{type(exc).__name__}: {exc}")
    finally:
        await admin.close()
    brokers: dict[int, str] = {}
    everyone: dict[int, bool] = {}
    for answer in answers:
        for resource in answer.to_object()["resources"]:
            if resource["error_code"]:
                return Authorizer({}, {}, f"DescribeConfigs error {resource['error_code']} for broker "
                                          f"{resource['resource_name']}: {resource['error_message']}")
            broker = int(resource["resource_name"])
            values = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
            brokers[broker] = values.get("authorizer.class.name") or ""
            everyone[broker] = (values.get("allow.everyone.if.no.acl.found") or "false") == "true"
    return Authorizer(brokers, everyone)


def problem(config: HealthConfig, found: Authorizer) -> str | None:
    """One line when the trusted topic cannot be trusted on this cluster (None when it can, as far as seen)."""
    topic = config.trusted_outcomes_topic
    override = env_name("trusted_outcomes_without_acl")
    if found.error:
        return (f"{env_name('trusted_outcomes_topic')}={topic}: cannot tell whether the cluster enforces ACLs "
                f"({found.error}); grant this principal DescribeConfigs on the cluster, or set {override}=1 to "
                "trust the topic anyway")
    if not found.enforced:
        none = sorted(b for b, name in found.brokers.items() if not name)
        return (f"{env_name('trusted_outcomes_topic')}={topic}: the cluster has no authorizer (broker(s) {none} "
                "have no authorizer.class.name), so any client may write that topic and its receipts would prove "
                f"nothing; configure an authorizer and the topic's ACLs (docs/receipts.md), or set {override}=1 "
                "if you accept it (single-tenant dev)")
    return None


async def require_authorizer(config: HealthConfig) -> None:
    """Refuse (UntrustedChannelError) a trusted topic on a cluster without an authorizer, unless overridden."""
    found = await read_authorizer(config)
    why = problem(config, found)
    if why is None:
        log.info("trusted receipts topic %s: authorizer %s; its ACLs are the operator's (docs/receipts.md)",
                 config.trusted_outcomes_topic, found.describe())
        if any(found.allow_everyone.values()):
            log.warning("trusted receipts topic %s: allow.everyone.if.no.acl.found=true on the brokers: the topic is "
                        "open unless it has ACLs (docs/receipts.md)", config.trusted_outcomes_topic)
        return
    if config.trusted_outcomes_without_acl:
        log.warning("%s; starting anyway: %s=1", why.split(";")[0], env_name("trusted_outcomes_without_acl"))
        return
    raise UntrustedChannelError(why)
