"""``kasctl agents``' table: one row per tunnel, '-' for what is not known, '*' for cluster-wide."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

from kasctl.agents import COLUMNS, run, table

AGENTS = [
    {"id": 1, "name": "demo", "connections": [
        {"pod": "agentd-0", "pod_uid": "u", "pod_namespace": "gitlab-agent", "node": "n1", "namespaces": ["a", "b"],
         "version": "0.1.0", "since": "2026-11-27T10:00:00Z", "replica": "kasd-0"},
        {"pod": None, "pod_uid": None, "pod_namespace": None, "node": None, "namespaces": None, "version": None,
         "since": None, "replica": "kasd-1"}]},
    {"id": 2, "name": "offline", "connections": []},
]


class Client:
    def get(self, path: str) -> Any:
        assert path == "/api/kasd/v1/agents"
        return AGENTS

    def events(self, path: str) -> Any:  # pragma: no cover
        raise AssertionError


def test_the_table_has_a_row_per_tunnel_and_says_what_is_unknown() -> None:
    lines = [line.split() for line in table(AGENTS).splitlines()]
    assert lines[0] == list(COLUMNS)
    assert lines[1] == ["1", "(demo)", "agentd-0", "gitlab-agent", "n1", "a,b", "kasd-0", "0.1.0", "2026-11-27T10:00:00Z"]
    assert lines[2] == ["1", "(demo)", "-", "-", "-", "-", "kasd-1", "-", "-"]
    assert lines[3] == ["2", "(offline)", *["-"] * 7]


def test_json_output_of_one_agent() -> None:
    out = io.StringIO()
    assert run(argparse.Namespace(agent=2, output="json"), Client(), out) == 0
    assert json.loads(out.getvalue()) == [AGENTS[1]]


def test_what_an_agent_claims_cannot_drive_the_terminal() -> None:
    """A compromised agentd's HELLO reaches this table: its escape sequences are shown, not acted on."""
    hostile = [{"id": 3, "name": "x", "connections": [
        {"pod": "p\x1b]0;owned\x07", "pod_namespace": "ns\r\x1b[2K", "node": "n\x9b31m", "namespaces": ["a\nb"],
         "version": "\u202e1.0", "since": "s", "replica": "r"}]}]
    text = table(hostile)
    assert text.isprintable() is False and all(line.isprintable() for line in text.splitlines())
    assert r"p\x1b]0;owned\x07" in text and r"ns\r\x1b[2K" in text and r"n\x9b31m" in text and r"a\nb" in text
    assert r"\u202e1.0" in text


def test_an_environment_stops_report_shows_what_an_agent_named_escaped() -> None:
    from kasctl.env import report

    text = report({"environment": "review/x", "project": "g/app", "agents": [
        {"id": 1, "namespace": "ns\x1b[2J", "delete_resources": "always", "deleted": ["cm/a\r\x1b[1Aok"]}]})
    assert all(line.isprintable() for line in text.splitlines()) and r"cm/a\r\x1b[1Aok" in text
