"""``kasctl env list`` / ``kasctl env status`` against a fake of kasd's REST API: the tree as text
(plain when not a terminal) or JSON, exit 1 when Degraded, ``--wait`` until Healthy or its timeout."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from kasctl.envstatus import duration, run_list, run_status
from kasctl.restclient import RestError

pytestmark = pytest.mark.timeout(10)


def _node(id_: str, status: str, message: str = "") -> dict[str, Any]:
    group, kind, namespace, name = id_.split("/")
    return {"id": id_, "group": group, "version": "v1", "kind": kind, "namespace": namespace, "name": name,
            "uid": "u", "labelled": True, "created": None, "health": {"status": status, "message": message}}


def graph(pod_status: str = "Healthy", message: str = "") -> dict[str, Any]:
    nodes = [_node("apps/Deployment/prod/hello", pod_status, message), _node("apps/ReplicaSet/prod/hello-7d9", "Healthy"),
             _node("/Pod/prod/hello-7d9-abc", pod_status, message), _node("/Service/prod/hello", "Healthy")]
    roll = {"status": pod_status, "message": f"/Pod/prod/hello-7d9-abc: {message}" if message else ""}
    return {"health": roll, "nodes": nodes, "roots": ["/Service/prod/hello", "apps/Deployment/prod/hello"],
            "edges": [{"source": "apps/Deployment/prod/hello", "target": "apps/ReplicaSet/prod/hello-7d9",
                       "relation": "owns"},
                      {"source": "apps/ReplicaSet/prod/hello-7d9", "target": "/Pod/prod/hello-7d9-abc",
                       "relation": "owns"},
                      {"source": "/Service/prod/hello", "target": "/Pod/prod/hello-7d9-abc", "relation": "selects"}]}


class FakeKasd:
    def __init__(self, status: str = "Healthy", message: str = "", stream: list[tuple[str, str]] | None = None,
                 clock: list[float] | None = None) -> None:
        self.graph = graph(status, message)
        self.stream = stream or []
        self.clock = clock
        self.paths: list[str] = []

    def get(self, path: str) -> Any:
        self.paths.append(path)
        if path.startswith("/api/v4/projects/group%2Fapp/environments?name="):
            return [{"id": 1, "name": "production"}] if "production" in path else []
        if path.startswith("/api/v4/projects/group%2Fapp/environments"):
            return [{"id": 1, "name": "production", "tier": "production", "state": "available"},
                    {"id": 2, "name": "review/x", "tier": None, "state": "available"}]
        if path == "/api/kasd/v1/environments/1":
            return {"environment": {"last_deployment": {"at": "2026-01-01T00:00:00.000Z"}},
                    "health": self.graph["health"]}
        if path == "/api/kasd/v1/environments/2":
            raise RestError("kasd refused (403): 403 Forbidden: user alice needs at least the Developer role")
        if path == "/api/kasd/v1/environments/1/resources":
            return {"environment": {"name": "production", "project": "group/app"}, "graph": self.graph,
                    "problems": [], "hint": None}
        raise AssertionError(path)

    def events(self, path: str) -> Iterator[tuple[str, str]]:
        assert path == "/api/kasd/v1/environments/1/resources/watch"
        for item in self.stream:
            if self.clock is not None:
                self.clock[0] += 30.0  # each event comes 30 s after the last
            yield item


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"project": "group/app", "environment": "production", "output": "text",
                                 "wait": False, "timeout": 300.0, **kw})


def test_status_prints_the_owns_tree_with_health_plain_when_not_a_terminal() -> None:
    out = io.StringIO()
    assert run_status(_args(), FakeKasd(), out=out) == 0
    text = out.getvalue()
    assert "\x1b[" not in text
    assert text.splitlines() == [
        "production (group/app): Healthy",
        "Service prod/hello            Healthy",
        "Deployment prod/hello         Healthy",
        "└─ ReplicaSet prod/hello-7d9  Healthy",
        "   └─ Pod prod/hello-7d9-abc  Healthy",
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_colours_health_only_on_a_terminal() -> None:
    out = _Terminal()
    assert run_status(_args(), FakeKasd("Degraded", "CrashLoopBackOff"), out=out) == 1
    assert "\x1b[31mDegraded" in out.getvalue()


def test_status_exits_1_when_degraded_and_prints_json_with_o_json() -> None:
    out = io.StringIO()
    assert run_status(_args(output="json"), FakeKasd("Degraded", "CrashLoopBackOff"), out=out) == 1
    assert json.loads(out.getvalue())["graph"]["health"]["status"] == "Degraded"
    assert run_status(_args(), FakeKasd("Progressing"), out=io.StringIO()) == 0
    err = io.StringIO()
    assert run_status(_args(environment="nope"), FakeKasd(), out=io.StringIO(), err=err) == 1
    assert "no environment 'nope' in project group/app" in err.getvalue()


def test_list_shows_each_environments_health_and_what_refused_it() -> None:
    out = io.StringIO()
    assert run_list(_args(), FakeKasd("Progressing"), out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAME", "TIER", "STATE", "HEALTH", "LAST", "DEPLOYED"]
    assert lines[1].split() == ["production", "production", "available", "Progressing", "2026-01-01T00:00:00.000Z"]
    assert lines[2].split() == ["review/x", "-", "available", "Unknown", "-"]
    out = io.StringIO()
    run_list(_args(output="json"), FakeKasd(), out=out)
    assert "Developer role" in json.loads(out.getvalue())[1]["health"]["message"]


def test_wait_follows_the_graph_until_healthy_with_a_progress_line() -> None:
    stream = [("graph", json.dumps(graph("Progressing", "Waiting for rollout"))),
              ("graph", json.dumps(graph("Healthy")))]
    out, err = io.StringIO(), io.StringIO()
    now = [0.0]
    assert run_status(_args(wait=True), FakeKasd(stream=stream, clock=now), out=out, err=err,
                      clock=lambda: now[0]) == 0
    assert err.getvalue().startswith("waiting for production: Progressing — /Pod/prod/hello-7d9-abc: Waiting for rollout")
    assert out.getvalue().startswith("production (group/app): Healthy")


def test_wait_times_out_saying_what_is_not_healthy() -> None:
    stream = [("graph", json.dumps(graph("Degraded", "CrashLoopBackOff")))] * 20
    out, err = io.StringIO(), io.StringIO()
    now = [0.0]
    assert run_status(_args(wait=True, timeout=60.0), FakeKasd(stream=stream, clock=now), out=out, err=err,
                      clock=lambda: now[0]) == 1
    assert now[0] <= 90.0  # it stopped following at the timeout
    assert "is not Healthy after 60 s (Degraded); not healthy:" in err.getvalue()
    assert "  /Pod/prod/hello-7d9-abc: Degraded — CrashLoopBackOff" in err.getvalue()


def test_timeout_durations() -> None:
    assert duration("5m") == 300 and duration("90s") == 90 and duration("1h") == 3600 and duration("45") == 45
    with pytest.raises(argparse.ArgumentTypeError):
        duration("soon")


def test_the_event_stream_reader_parses_events_and_sends_the_token_as_private_token() -> None:
    import http.server
    import threading

    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("PRIVATE-TOKEN"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b': connected\n\nevent: graph\ndata: {"a":\ndata: 1}\n\n: ping\n\nevent: end\ndata: {}\n\n')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        from kasctl.restclient import rest_events
        events = list(rest_events(f"http://127.0.0.1:{server.server_port}", "/w", "tok", None, read_timeout=5))
    finally:
        thread.join(5)
        server.server_close()
    assert events == [("graph", '{"a":\n1}'), ("end", "{}")]
    assert seen == ["tok"]


def test_a_tenants_condition_message_cannot_drive_the_terminal() -> None:
    """A pod's condition message is written by whoever runs the pod: shown escaped, colour kasctl's own."""
    out = _Terminal()
    assert run_status(_args(), FakeKasd("Degraded", "boom\x1b]0;owned\x07\r\x1b[1A"), out=out) == 1
    text = out.getvalue()
    assert r"boom\x1b]0;owned\x07\r\x1b[1A" in text and "\x1b]" not in text and "\r" not in text
    assert "\x1b[31mDegraded" in text


def test_following_a_tenants_condition_message_cannot_drive_the_terminal_either() -> None:
    stream = [("graph", json.dumps(graph("Degraded", "x\x1b]0;owned\x07\r")))] * 3
    out, err = io.StringIO(), io.StringIO()
    now = [0.0]
    assert run_status(_args(wait=True, timeout=60.0), FakeKasd(stream=stream, clock=now), out=out, err=err,
                      clock=lambda: now[0]) == 1
    assert r"x\x1b]0;owned\x07\r" in err.getvalue() and "\x1b" not in err.getvalue() + out.getvalue()
