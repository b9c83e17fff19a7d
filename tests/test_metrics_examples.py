"""The monitoring examples: ``examples/prometheus/prometheus.yml`` passes Debian's ``promtool check
config``; the Kubernetes pod job keeps the ports deploy/kubernetes names; every query of the Grafana
dashboard (``examples/grafana/kasd-agentd.json``) names only series kasd and agentd export (that
Prometheus accepts each one is tests/e2e/test_services.py's, against the real one)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agentd.connection import ManagerStatistics
from agentd.metrics import AgentMetrics
from kasd.metrics import Metrics, event_metrics
from routing.local import TunnelRegistry
from tests.prometheus import NO_PROMETHEUS

pytestmark = pytest.mark.timeout(30)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DASHBOARD = EXAMPLES / "grafana" / "kasd-agentd.json"
#: what a series of each metric type is called in the text format
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def dashboard_exprs() -> list[str]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def exported_series() -> set[str]:
    """Every series name both daemons can export (kasd with replicas and events; agentd with its manager)."""
    kasd = Metrics(TunnelRegistry())
    kasd.enable_replicas(redis_up=lambda: True, peers_out=lambda: 0, peers_in=lambda: 0)
    event_metrics(kasd)
    kasd.enable_tls_reloads(list)
    agentd = AgentMetrics()
    agentd.watch_manager(lambda: ManagerStatistics(tunnels_up=0, tunnels_draining=0, dials=0, failures=0, rejected=0,
                                                   goaways=0, streams_active=0, streams_handled=0))
    agentd.watch_tls([])
    names: set[str] = set()
    registry: CollectorRegistry
    for registry in (kasd.registry, agentd.registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names


def test_every_dashboard_query_names_only_series_the_daemons_export() -> None:
    exported = exported_series()
    named = {name for expr in dashboard_exprs() for name in re.findall(r"\b(?:kasd|agentd)_[a-z_]+\b", expr)}
    assert named and named <= exported, sorted(named - exported)
    # the dashboard is a Grafana model with its Prometheus data source as a variable
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 39
    assert [v["name"] for v in board["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in board["panels"] if p["type"] != "row")


def test_promtool_accepts_the_scrape_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:  # Debian's prometheus package ships it; CI installs that
        raise AssertionError(NO_PROMETHEUS)
    done = subprocess.run([promtool, "check", "config", str(EXAMPLES / "prometheus" / "prometheus.yml")],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_kubernetes_pod_job_keeps_the_daemons_metrics_ports_and_nothing_else() -> None:
    config = yaml.safe_load((EXAMPLES / "prometheus" / "prometheus-kubernetes.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    keep = next(rule for rule in job["relabel_configs"]
                if rule["source_labels"] == ["__meta_kubernetes_pod_container_port_name"])
    assert keep["action"] == "keep"
    kept = [name for name in ("observability", "health", "metrics", "agent", "kubernetes-api", "private")
            if re.fullmatch(keep["regex"], name)]
    assert kept == ["observability", "health", "metrics"]
