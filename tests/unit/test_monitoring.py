"""Alerts and dashboards as code: the rules pass promtool's checks and unit tests, every query parses
and names only series the worker exports (or the rules record), and the k8s copies match."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_metrics_doc import worker_metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "loopwarden.json"
K8S = ROOT / "k8s" / "monitoring"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool not on PATH: `make setup` installs Debian's prometheus package (as root)"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def exported_series() -> set[str]:
    """Series names the worker's registry exports, including those of labelled metrics with no child yet."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for family in worker_metrics().registry.collect():
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        names |= {s.name for s in family.samples}
    return names


def recorded() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def series_named(expr: str) -> set[str]:
    """The metric names an expression reads (loopwarden's, the process collector's, recording rules, up)."""
    bare = re.sub(r'"[^"]*"', '""', expr)  # label values are not names
    return set(re.findall(r"\b(?:loopwarden[_:][A-Za-z0-9_:]+|process_[a-z_]+|up)\b(?=\s*[{\[)\s]|$)", bare))


def test_promtool_checks_the_rules() -> None:
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in res.stdout


def test_promtool_unit_tests_of_every_alert_and_recording_rule_pass() -> None:
    """rules_test.yml fires each alert on series written for it (and checks it stays quiet before)."""
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    tested |= set(re.findall(r"expr: (loopwarden:[a-z0-9_:]+)", RULES_TEST.read_text()))
    groups = yaml.safe_load(RULES.read_text())["groups"]
    names = {r.get("alert") or r.get("record") for g in groups for r in g["rules"]}
    assert names - {"loopwarden:runs:sum_by_state", "loopwarden:transitions:rate5m"} <= tested, names - tested
    res = promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_fails_a_wrong_expectation(tmp_path) -> None:
    """The unit tests can fail: the same file with one expected value changed does."""
    shutil.copy(RULES, tmp_path / "rules.yml")
    (tmp_path / "t.yml").write_text(RULES_TEST.read_text().replace("value: 42", "value: 41", 1))
    res = promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert res.returncode != 0 and "FAILED" in res.stdout + res.stderr


def test_every_dashboard_query_parses(tmp_path) -> None:
    """Each panel query as a recording rule through `promtool check rules` (it parses PromQL)."""
    exprs = dashboard_exprs()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in res.stdout


def test_queries_name_only_series_the_worker_exports() -> None:
    exported, records = exported_series(), recorded()
    for where, expr in [("rules.yml", e) for e in rule_exprs()] + dashboard_exprs():
        names = series_named(expr)
        assert names, (where, expr)
        for name in names:
            if ":" in name:
                assert name in records, (where, name)
            elif name != "up":
                assert name in exported, (where, name)


def test_the_name_check_sees_a_typo() -> None:
    assert series_named('sum(rate(loopwarden_transitons_total{to_state="STUCK"}[5m]))') == {"loopwarden_transitons_total"}
    assert "loopwarden_transitons_total" not in exported_series()


def test_dashboard_covers_what_an_operator_asks() -> None:
    """Runs by state, transitions, stop causes, disagreements, receipts, latency, lag, dead letters."""
    dash = json.loads(DASHBOARD.read_text())
    text = " ".join(e for _, e in dashboard_exprs())
    for series in ("loopwarden:runs:sum_by_state", "loopwarden:transitions:rate5m", "loopwarden_stop_causes_total",
                   "loopwarden_disagreements_total", "loopwarden_receipts_total", "loopwarden_event_to_transition_seconds",
                   "loopwarden:consumer_lag:sum", "loopwarden_invalid_events_total", "loopwarden:agent_false_complete:ratio1h"):
        assert series in text, series
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])


def test_k8s_monitoring_copies_match_the_sources() -> None:
    rule = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert (K8S / "loopwarden-dashboard.json").read_bytes() == DASHBOARD.read_bytes()
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {"prometheusrule.yaml", "servicemonitor.yaml", "scaledobject.yaml"}


def test_keda_scales_to_the_partition_count_at_most() -> None:
    scaled = yaml.safe_load((K8S / "scaledobject.yaml").read_text())
    config = yaml.safe_load((ROOT / "k8s" / "configmap.yaml").read_text())
    assert scaled["spec"]["maxReplicaCount"] == int(config["data"]["LOOPWARDEN_PARTITIONS"])
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    assert trigger["bootstrapServers"] == config["data"]["LOOPWARDEN_BROKER"]


def test_servicemonitor_selects_one_service() -> None:
    monitor = yaml.safe_load((K8S / "servicemonitor.yaml").read_text())
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = list(yaml.safe_load_all((ROOT / "k8s" / "service.yaml").read_text()))
    matched = [s["metadata"]["name"] for s in services if wanted.items() <= s["metadata"]["labels"].items()]
    assert matched == ["loopwarden-headless"]
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in services[0]["spec"]["ports"]}


# Custom resources: kubernetes-validate knows the built-in kinds only; these are validated against their
# CRDs' schemas by k8s/validate/validate.mjs (the kubernetes-models packages).
CUSTOM_KINDS = {"PrometheusRule", "ServiceMonitor", "ScaledObject"}
VALIDATE = ROOT / "k8s" / "validate"


def validate_custom(*files: Path) -> tuple[int, list[dict]]:
    node = shutil.which("node")
    assert node, "node is not on PATH: `make node`"
    assert (VALIDATE / "node_modules" / "@kubernetes-models").is_dir(), "run `make node` (npm ci in k8s/validate)"
    res = subprocess.run([node, str(VALIDATE / "validate.mjs"), *map(str, files)], capture_output=True, text=True,
                         timeout=120)
    return res.returncode, [json.loads(line) for line in res.stdout.splitlines()]


def test_custom_resources_validate_against_their_crd_schemas() -> None:
    code, results = validate_custom(*sorted(K8S.glob("*.yaml")))
    checked = {r["kind"]: r for r in results if "skipped" not in r}
    assert set(checked) == CUSTOM_KINDS and all(r["ok"] for r in checked.values()), results
    assert code == 0


def test_the_crd_validation_sees_an_error(tmp_path) -> None:
    monitor = yaml.safe_load((K8S / "servicemonitor.yaml").read_text())
    monitor["spec"]["endpoints"][0]["port"] = 6066  # a port *name* is a string
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(monitor))
    code, results = validate_custom(tmp_path / "bad.yaml")
    assert code == 1 and not results[0]["ok"] and "port must be string" in results[0]["error"]


def k8s_objects() -> list[tuple[str, dict]]:
    """Every object `kubectl apply -k` creates from k8s/ and k8s/monitoring/ (generated ConfigMaps too)."""
    out = []
    for base in (ROOT / "k8s", K8S):
        kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
        listed = set(kustomization["resources"])
        on_disk = {p.name for p in base.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
        assert listed == on_disk, (base, listed ^ on_disk)
        for name in sorted(listed) + (["secret.example.yaml"] if base.name == "k8s" else []):
            out += [(name, doc) for doc in yaml.safe_load_all((base / name).read_text()) if doc]
        for gen in kustomization.get("configMapGenerator", []):
            out.append((gen["name"], {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": gen["name"], "labels": gen.get("options", {}).get("labels", {})},
                "data": {f: (base / f).read_text() for f in gen["files"]}}))
    return out


def test_every_k8s_object_validates_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    kinds = []
    for name, doc in k8s_objects():
        kinds.append(doc["kind"])
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Secret"} | CUSTOM_KINDS == set(kinds)


def test_the_k8s_validation_sees_an_error() -> None:
    import kubernetes_validate

    service = next(doc for _, doc in k8s_objects() if doc["kind"] == "Service")
    broken = {**service, "spec": {**service["spec"], "ports": [{"name": "http", "port": "six"}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
