"""The deliverer's alerts as code: promtool checks and unit-tests them, there is one per escalation reason
class, and they read only series `loopwarden actions` exports."""

from __future__ import annotations

from pathlib import Path

import yaml

from loopwarden.actions import ActionMetrics
from tests.unit.test_monitoring import promtool, series_named

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "actions-rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "actions-rules_test.yml"
# escalation_class's values (loopwarden/actions.py): the metric's reason label
CLASSES = {"attempts_exhausted", "not_idempotent", "producer_dropped", "uncertain", "policy", "person"}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_the_actions_rules() -> None:
    """`promtool check rules` accepts every rule of the file."""
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


def test_promtool_unit_tests_fire_each_actions_alert() -> None:
    """actions-rules_test.yml fires every alert on series written for it and checks it stays quiet otherwise."""
    tested = {t["alertname"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"] for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for r in rules()}
    res = promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert res.returncode == 0, res.stdout + res.stderr


def test_each_escalation_reason_class_has_its_alert_routed_by_escalate_to() -> None:
    """One alert per reason class, keeping the escalate_to label Alertmanager routes on."""
    by_reason = {r["labels"]["reason"]: r for r in rules() if "reason" in r["labels"]}
    assert set(by_reason) == CLASSES
    for reason, rule in by_reason.items():
        assert f'reason="{reason}"' in rule["expr"] and "sum by (escalate_to)" in rule["expr"], rule["alert"]


def test_the_rules_read_only_series_the_deliverer_exports() -> None:
    """Every name in an expression is a series of the deliverer's registry (or `up`)."""
    suffixes = {"counter": ("_total",), "gauge": ("",)}
    exported = {f.name + s for f in ActionMetrics().registry.collect() for s in suffixes[f.type]}
    for rule in rules():
        names = series_named(rule["expr"])
        assert names and names <= exported | {"up"}, (rule["alert"], names - exported)


def test_prometheus_loads_the_actions_rules_and_scrapes_the_deliverer() -> None:
    """deploy/prometheus.yml lists the file (as compose mounts it) and a loopwarden-actions job."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert "/etc/prometheus/actions-rules.yml" in config["rule_files"]
    assert "loopwarden-actions" in {job["job_name"] for job in config["scrape_configs"]}
