"""The webhook deliverer's pure parts: the signature a receiver checks, escalation classes, the offsets it may
commit, and its settings' one-line errors."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from loopwarden.actions import _Offsets, escalation_class, signature, verify
from loopwarden.cli import build_parser
from loopwarden.codecs.events import RecoveryAction
from loopwarden.commands.actions import settings_from

SECRET = b"0123456789abcdef0123"


def escalation(reason: str, decided_by: str = "policy:v1") -> RecoveryAction:
    return RecoveryAction(action_id="r:3", run_id="r", agent="a", job_id="r", attempt=1, next_attempt=None, action="escalate",
                          reason=reason, ts=1, not_before_ts=1, next_policy=None, escalate_to=None, decided_by=decided_by)


def test_the_signature_is_the_hex_hmac_sha256_of_the_body() -> None:
    """`sha256=` and hex HMAC-SHA256, as docs/actions.md tells a receiver to compute it."""
    body = b'{"type":"recovery_action"}'
    assert signature(SECRET, body) == "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()


def test_verify_accepts_the_signed_body_and_refuses_any_other() -> None:
    """A changed body, another secret or a missing header does not verify."""
    body = b'{"action_id":"r:3"}'
    header = signature(SECRET, body)
    assert verify(SECRET, body, header)
    assert not verify(SECRET, body + b" ", header)
    assert not verify(b"another-secret-entirely", body, header)
    assert not verify(SECRET, body, None)


@pytest.mark.parametrize(("reason", "decided_by", "cls"), [
    ("attempts_exhausted", "policy:v1", "attempts_exhausted"),
    ("FAILED:not_idempotent", "policy:v1", "not_idempotent"),
    ("STUCK:producer_dropped", "policy:v1", "producer_dropped"),
    ("UNCERTAIN:receipt_window_elapsed", "policy:v1", "uncertain"),
    ("BOUNDED_STOP:stop_condition", "policy:v1", "policy"),
    ("the customer called", "person:alice-key/alice", "person"),
])
def test_each_escalation_reason_falls_in_one_bounded_class(reason: str, decided_by: str, cls: str) -> None:
    """The metric's reason label is one of six classes, whatever words a person wrote."""
    assert escalation_class(escalation(reason, decided_by)) == cls


def test_offsets_are_committed_only_up_to_the_first_action_not_delivered() -> None:
    """A later action delivered first does not move the commit past an earlier one still pending."""
    offsets = _Offsets()
    for o in (10, 11, 12):
        offsets.add(o)
    offsets.done.add(11)
    assert offsets.committable() is None
    offsets.done.add(10)
    assert offsets.committable() == 12
    assert offsets.committable() == 12, "asked again until the group has it (a failed commit is retried)"
    offsets.committed = 12
    assert offsets.committable() is None
    offsets.done.add(12)
    assert offsets.committable() == 13


def parse(*argv: str):
    return build_parser(True).parse_args(["actions", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    ((), "no webhook: give --webhook"),
    (("--webhook", "http://ctl.example/actions"), "--webhook 'http://ctl.example/actions' must be an https:// URL"),
    (("--webhook", "https:///actions"), "must be an https:// URL with a host"),
    (("--webhook", "https://ctl.example", "--secret-file", "/no/such/file"), "--secret-file '/no/such/file': cannot read"),
    (("--webhook", "https://ctl.example", "--ca-file", "/no/such/ca.pem"), "--ca-file '/no/such/ca.pem'"),
    (("--webhook", "https://ctl.example", "--max-backoff-s", "0"), "--max-backoff-s must be >= 0.001, got 0.0"),
])
def test_each_bad_setting_is_one_line_naming_it(argv, message, monkeypatch) -> None:
    """Refused before connecting, in one line that names the flag and its value."""
    for name in ("WEBHOOK", "SECRET_FILE", "CA_FILE", "MAX_BACKOFF_S"):
        monkeypatch.delenv(f"LOOPWARDEN_ACTIONS_{name}", raising=False)
    with pytest.raises(SystemExit) as exc:
        settings_from(parse(*argv))
    text = str(exc.value)
    assert text.startswith("loopwarden actions: ") and message in text and "\n" not in text


def test_a_short_secret_is_refused(tmp_path) -> None:
    """A secret under 16 bytes signs nothing worth trusting: refused, naming the file."""
    short = tmp_path / "secret"
    short.write_bytes(b"hunter2\n")
    with pytest.raises(SystemExit, match="at least 16 bytes, got 7"):
        settings_from(parse("--webhook", "https://ctl.example", "--secret-file", str(short)))


def test_settings_come_from_the_environment_when_no_flag_gives_them(tmp_path, monkeypatch) -> None:
    """LOOPWARDEN_ACTIONS_* name the webhook, secret and topic; the secret's trailing newline is not part of it."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    monkeypatch.setenv("LOOPWARDEN_ACTIONS_WEBHOOK", "https://ctl.example/actions")
    monkeypatch.setenv("LOOPWARDEN_ACTIONS_SECRET_FILE", str(secret))
    monkeypatch.setenv("LOOPWARDEN_ACTIONS_TOPIC", "fleet.actions")
    settings = settings_from(parse())
    assert (settings.webhook, settings.secret, settings.topic, settings.group) == (
        "https://ctl.example/actions", SECRET, "fleet.actions", "loopwarden-actions")


def test_the_actions_doc_lists_every_metric_the_deliverer_exports() -> None:
    """docs/actions.md's metrics table names exactly the deliverer's series."""
    import re
    from pathlib import Path

    from loopwarden.actions import ActionMetrics

    doc = (Path(__file__).resolve().parents[2] / "docs" / "actions.md").read_text()
    documented = set(re.findall(r"^\| `(loopwarden_actions_[a-z_]+)` \|", doc, flags=re.M))
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in ActionMetrics().registry.collect()}
    assert documented == exported, (exported - documented, documented - exported)
