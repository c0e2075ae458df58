"""Monitoring as shipped: the PrometheusRule passes `promtool check rules` and its unit
tests (`promtool test rules`, alerts_test.yaml), every alert has a test and a runbook
section, and every metric the alerts and the Grafana dashboard read is one the operator
exports (found by reading the code) or, for alerts only, a named metric of the API server or
cert-manager."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml
from unit.config.manifests import CONFIG, REPO, Obj, find, render, tool

HERE = Path(__file__).parent
DASHBOARD = CONFIG / "grafana" / "gpu-operator-dashboard.json"
RUNBOOK = REPO / "docs" / "runbook.md"
#: Metrics of other components the alerts read, and why.
FOREIGN = {
    # Calls the API server could not make never reach the operator's own histogram.
    "apiserver_admission_webhook_rejection_count",
    # The serving certificate of the certmanager component.
    "certmanager_certificate_expiration_timestamp_seconds",
}
_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
#: The families a custom collector yields, scanned as the metric they expose.
_FAMILIES = {
    "CounterMetricFamily": "Counter",
    "GaugeMetricFamily": "Gauge",
    "HistogramMetricFamily": "Histogram",
    "SummaryMetricFamily": "Summary",
    "InfoMetricFamily": "Info",
}


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """The module's top-level string constants (``FAMILY: Final = "gpuoperator_..."``)."""
    out: dict[str, str] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value = node.target.id, node.value
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            target, value = node.targets[0].id, node.value
        if target and isinstance(value, ast.Constant) and isinstance(value.value, str):
            out[target] = value.value
    return out


def exported_metrics() -> set[str]:
    """Sample names the operator's code exposes: every prometheus_client metric (or custom
    collector's metric family) constructed with a literal name under gpuoperator/,
    controllers/ and admission/, re-created in a scratch registry so prometheus_client
    itself says which sample names it exposes (``_total`` for counters,
    ``_bucket``/``_sum``/``_count`` for histograms...)."""
    registry = prometheus_client.CollectorRegistry()
    seen: set[str] = set()
    for top in ("gpuoperator", "controllers", "admission"):
        for path in sorted((REPO / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            constants = _module_strings(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                kind = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                kind = _FAMILIES.get(kind, kind)
                first = node.args[0]
                name = None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    name = first.value
                elif isinstance(first, ast.Name):
                    name = constants.get(first.id)
                if kind in _TYPES and name is not None and name not in seen:
                    seen.add(name)
                    cls = getattr(prometheus_client, kind)
                    cls(name, "scanned", registry=registry)
    return {s.name for family in registry.collect() for s in family.samples}


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "le"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if re.match(r"\s*\(", text[m.end() :]):
            continue  # a function or aggregation
        if m.group().lower() in _KEYWORDS:
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # a unit of a number (1e3) or a duration
        names.add(m.group())
    return names


def test_metric_names_are_read_out_of_expressions() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, webhook) (rate(a_bucket{x="y"}[5m]))) > 0.5 '
        "and on (instance) (b == 1) or vector(0) unless ignoring (kind) c_total offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c_total"}


def test_the_metric_scan_sees_every_kind_of_metric() -> None:
    exported = exported_metrics()
    assert {
        "gpuoperator_leader_is_leader",  # gauge
        "gpuoperator_reconcile_total",  # counter
        "gpuoperator_leader_transitions_total",  # counter named without _total
        "gpuoperator_webhook_duration_seconds_bucket",  # histogram
        "gpuoperator_workqueue_depth",  # prometheus_client.Gauge
        "gpuoperator_claims",  # a custom collector's GaugeMetricFamily
    } <= exported


def _rule() -> Obj:
    return find(render("overlays/production"), "PrometheusRule", "gpu-operator")


def _alerts() -> list[Obj]:
    return [r for g in _rule()["spec"]["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.needs_tools
def test_alerts_read_only_metrics_the_operator_exports_or_named_foreign_ones() -> None:
    exported = exported_metrics()
    for alert in _alerts():
        used = metric_names(alert["expr"])
        assert used, alert["alert"]
        unknown = {m for m in used if m not in exported and m not in FOREIGN}
        assert unknown == set(), f"{alert['alert']} reads {unknown}"


def _dashboard_exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _dashboard_exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _dashboard_exprs(v)]
    return []


def test_the_dashboard_reads_only_metrics_the_operator_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _dashboard_exprs(dashboard)
    assert len(exprs) >= 10
    exported = exported_metrics()
    for expr in exprs:
        used = metric_names(expr)
        assert used and used <= exported, f"{expr} reads {used - exported}"


@pytest.mark.needs_tools
def test_the_dashboard_is_shipped_as_a_configmap_for_grafana() -> None:
    cm = find(render("overlays/production"), "ConfigMap", "gpu-operator-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"][DASHBOARD.name]) == json.loads(DASHBOARD.read_text())


@pytest.mark.needs_tools
def test_every_alert_has_a_runbook_section_and_says_where() -> None:
    headings = {
        line[3:].strip() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")
    }
    for alert in _alerts():
        assert alert["alert"] in headings, f"docs/runbook.md has no section {alert['alert']}"
        assert alert["annotations"]["runbook_url"] == f"docs/runbook.md#{alert['alert'].lower()}"
        assert alert["labels"]["severity"] in ("critical", "warning", "info")


@pytest.mark.needs_tools
def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for alert in _alerts():
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{alert['alert']} never fires in a test"
        assert any(not c["exp_alerts"] for c in mine), f"{alert['alert']} is never quiet"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return tool("promtool")


def _write_rules(directory: Path) -> Path:
    rules = directory / "gpu-operator.rules.yaml"
    rules.write_text(yaml.safe_dump(_rule()["spec"]))
    return rules


@pytest.mark.needs_tools
def test_promtool_accepts_the_rules(promtool: Path, tmp_path: Path) -> None:
    rules = _write_rules(tmp_path)
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


@pytest.mark.needs_tools
def test_promtool_unit_tests_of_the_alerts_pass(promtool: Path, tmp_path: Path) -> None:
    _write_rules(tmp_path)
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    proc = subprocess.run(
        [str(promtool), "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
