"""In-cluster services end to end: real kubesim, kasd and agentd processes and a REAL Prometheus
(Debian's ``prometheus``, ``tests/prometheus.py``) on 127.0.0.1 scraping kasd's ``/metrics`` (and
agentd's health address).
One stack and one Prometheus for the module: a PromQL query through kasd → agentd → Prometheus is
the same as asked directly (REST and ``kasctl promql``), a large range query comes through whole,
agentd refuses a path outside its allow-list with a Status, kasd refuses traversal, and a service
that never answers is a 504."""

from __future__ import annotations

import io
import json
import signal
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kasctl import promql
from kasctl.stack import AGENT_NAME, CONFIG_PROJECT, DEMO_AGENT_CONFIG, Stack
from tests.prometheus import PrometheusProcess, needs_prometheus, prometheus_yml
from tests.prometheus import query as prometheus_query

pytestmark = [pytest.mark.timeout(120), needs_prometheus]

SERVICES = """\
services:
  - name: prometheus
    ci_access: {projects: [{id: group/demo}]}
    user_access: {projects: [{id: group/demo}]}
  - name: silent
    user_access: {projects: [{id: group/demo}]}
"""


class SilentServer:
    """Accepts connections and never answers (a hung in-cluster service)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


class World:
    def __init__(self, stack: Stack, prometheus_url: str) -> None:
        self.stack = stack
        self.prometheus_url = prometheus_url
        self.context = ssl.create_default_context(cafile=str(stack.ca_file))

    def via_kasd(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.stack.api_url + path,
                                         headers={"PRIVATE-TOKEN": self.stack.personal_token, **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
                return response.status, dict(response.headers.items()), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), exc.read()

    def direct(self, path: str) -> Any:
        with urllib.request.urlopen(self.prometheus_url + path, timeout=30) as response:
            return json.loads(response.read())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("services")
    silent = SilentServer()
    # Prometheus first (agentd's services: names its URL), scraping kasd and agentd once they are up.
    prometheus = PrometheusProcess(workdir / "prometheus").start()
    stack = Stack(workdir / "stack", agent_wait_timeout=2.0, agentd_settings={"services": [
        {"name": "prometheus", "url": prometheus.url, "methods": ["GET", "POST"], "paths": ["/api/v1/"]},
        {"name": "silent", "url": f"http://127.0.0.1:{silent.port}", "response_header_timeout": 1},
    ]})
    stack.auth.agent_config(CONFIG_PROJECT, AGENT_NAME, DEMO_AGENT_CONFIG + SERVICES)
    try:
        stack.start()
        targets = [stack.addresses["observability"], stack.agentd_health]
        (prometheus.dir / "prometheus.yml").write_text(
            prometheus_yml(targets, f"127.0.0.1:{prometheus.port}", prometheus.scrape_interval))
        assert prometheus.proc is not None
        prometheus.proc.send_signal(signal.SIGHUP)  # Prometheus reloads its configuration
        world = World(stack, prometheus.url)
        # Prometheus tells no one when it scrapes: ask until it has scraped both daemons twice (or give up).
        deadline = time.monotonic() + 60
        while True:
            result = prometheus_query(prometheus.url, "count_over_time(up[1m])")["data"]["result"]
            counts = {r["metric"]["instance"]: float(r["value"][1]) for r in result}
            if all(counts.get(target, 0) >= 2 for target in targets):
                break
            assert time.monotonic() < deadline, "Prometheus did not scrape kasd and agentd: " + \
                prometheus.log_file.read_text()[-2000:]
            time.sleep(0.2)
        yield world
    finally:
        prometheus.stop()
        codes = stack.stop()
        silent.close()
        assert codes == {"agentd": 0, "kasd": 0, "kubesim": 0}, codes


def _data(body: bytes) -> Any:
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]


def test_a_query_through_the_tunnel_is_the_same_as_directly(world: World) -> None:
    at = time.time() - 1
    query = f"query=up&time={at:.3f}"
    direct = world.direct(f"/api/v1/query?{query}")["data"]
    instances = {s["metric"]["instance"] for s in direct["result"]}
    assert {world.stack.addresses["observability"], world.stack.agentd_health} <= instances
    # both daemons' own /metrics answered the scrape (up is 1, not a failed scrape's 0)
    assert {s["metric"]["instance"]: s["value"][1] for s in direct["result"]}[world.stack.agentd_health] == "1"
    status, _, body = world.via_kasd(f"/api/kasd/v1/agents/1/promql?{query}")
    assert status == 200 and _data(body) == direct
    status, _, body = world.via_kasd(f"/api/v4/agents/1/services/prometheus/api/v1/query?{query}")
    assert status == 200 and _data(body) == direct
    # kasctl promql, in-process (the same REST call): JSON and the table
    env = {"KASCTL_TOKEN": world.stack.personal_token, "KASCTL_API_URL": world.stack.api_url,
           "KASCTL_CA_FILE": str(world.stack.ca_file)}
    out = io.StringIO()
    args = promql_args("--agent", "1", "--time", f"{at:.3f}", "--output", "json", "up")
    assert promql.run(args, out=out, environ=env) == 0
    assert json.loads(out.getvalue())["data"] == direct
    out = io.StringIO()
    assert promql.run(promql_args("--agent", "1", "--time", f"{at:.3f}", "up"), out=out, environ=env) == 0
    assert f'up{{instance="{world.stack.addresses["observability"]}", job="targets"}}' in out.getvalue()
    # a bad query: Prometheus's own words, exit 1
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stderr", err)
        assert promql.run(promql_args("--agent", "1", "sum(up"), out=io.StringIO(), environ=env) == 1
    assert "Prometheus refused the query (bad_data)" in err.getvalue()


def test_a_large_range_query_comes_through_whole(world: World) -> None:
    end = time.time()
    # every series of kasd's scrapes, at a 3 ms step (10,000 points each): far beyond the API port's 64 KiB
    instance = world.stack.addresses["observability"]
    selector = urllib.parse.quote(f'{{instance="{instance}"}}', safe="")
    # A scrape under way at `end` would add its samples (stamped when it began) between the two
    # queries, and the answers would differ for that reason alone: ask once a later scrape is in
    # (Prometheus scrapes a target one scrape after another, so every earlier one is in too).
    deadline = time.monotonic() + 20
    while not any(float(r["value"][1]) > end for r in prometheus_query(
            world.prometheus_url, f'timestamp(up{{instance="{instance}"}})')["data"]["result"]):
        assert time.monotonic() < deadline, "Prometheus scraped kasd no more"
        time.sleep(0.2)
    query = f"query={selector}&start={end - 30:.3f}&end={end:.3f}&step=0.003"
    direct = world.direct(f"/api/v1/query_range?{query}")
    started = time.monotonic()
    status, headers, body = world.via_kasd(f"/api/v4/agents/1/services/prometheus/api/v1/query_range?{query}")
    took = time.monotonic() - started
    assert status == 200 and len(body) > 512 * 1024, (status, len(body))
    assert json.loads(body) == direct
    assert "Content-Length" not in headers or int(headers["Content-Length"]) == len(body)
    assert took < 30


def test_a_path_outside_agentds_allow_list_is_its_403_status(world: World) -> None:
    status, _, body = world.via_kasd("/api/v4/agents/1/services/prometheus/-/quit")
    answer = json.loads(body)
    assert status == 403 and answer["kind"] == "Status" and answer["reason"] == "Forbidden"
    assert "prometheus" in answer["message"] and "/api/v1/" in answer["message"]


@pytest.mark.parametrize("path", ["/api/v1/../../-/quit", "/api/v1/%2e%2e/%2E%2E/-/quit", "/api/v1%2f..%2f-/quit"])
def test_traversal_in_the_rest_path_is_refused(world: World, path: str) -> None:
    status, _, body = world.via_kasd(f"/api/v4/agents/1/services/prometheus{path}")
    assert status == 400 and "400 Bad Request" in json.loads(body)["message"]


def test_a_service_that_never_answers_is_a_clear_504(world: World) -> None:
    status, _, body = world.via_kasd("/api/v4/agents/1/services/silent/anything")
    answer = json.loads(body)
    assert status == 504 and answer["code"] == 504, answer
    assert "silent" in answer["message"] or "1" in answer["message"]


def test_prometheus_scrapes_the_new_series_and_accepts_every_dashboard_query(world: World) -> None:
    # a request that reaches the agent (its usage) and one refused before any grant
    status, _, _ = world.via_kasd("/api/v4/agents/1/services/prometheus/api/v1/query?query=up")
    assert status == 200
    assert world.via_kasd("/api/v4/agents/1/services/prometheus/api/v1/query?query=up",
                          headers={"PRIVATE-TOKEN": "glpat-wrong"})[0] == 401
    kasd, agentd = world.stack.addresses["observability"], world.stack.agentd_health
    expected = {
        f'kasd_agent_requests_total{{instance="{kasd}",agent="1",access_type="pat_access"}}': 1,
        f'kasd_proxied_requests_total{{instance="{kasd}",status_class="2xx",access_type="pat_access",agent="1"}}': 1,
        f'kasd_proxied_requests_total{{instance="{kasd}",status_class="4xx",access_type="none",agent=""}}': 1,
        f'kasd_routing_duration_seconds_count{{instance="{kasd}",status="success"}}': 1,
        f'kasd_agent_tunnels{{instance="{kasd}",agent="1"}}': 1,
        f'kasd_connected_pods{{instance="{kasd}",agent="1"}}': 1,
        f'kasd_tunnel_breaker_open{{instance="{kasd}",agent="1"}}': 0,
        f'agentd_upstream_latency_seconds_count{{instance="{agentd}",target="service:prometheus"}}': 1,
        f'agentd_reconnects_total{{instance="{agentd}"}}': 0,
    }
    # Prometheus tells no one when it scrapes (every second here): ask until the requests above are in.
    deadline = time.monotonic() + 20
    while True:
        seen: dict[str, float | None] = {}
        for selector in expected:
            result = prometheus_query(world.prometheus_url, f"sum({selector})")["data"]["result"]
            seen[selector] = float(result[0]["value"][1]) if result else None
        if all(value is not None and value >= expected[selector] for selector, value in seen.items()):
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    # every query of the Grafana dashboard is PromQL the real Prometheus accepts
    board = json.loads((Path(__file__).resolve().parents[2] / "examples/grafana/kasd-agentd.json").read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m")
            answer = prometheus_query(world.prometheus_url, expr)
            assert answer["status"] == "success", (panel["title"], expr, answer)


def promql_args(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    promql.add_command(parser.add_subparsers())
    return parser.parse_args(["promql", *argv])
