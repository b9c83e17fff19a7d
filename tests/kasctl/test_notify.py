"""``kasctl notify`` against a fake of kasd's REST API: the event posted with the token a user or a
CI job has, --wait until its status ends, and --config-changed as a post-receive hook."""

from __future__ import annotations

import io
from typing import Any

import pytest

from kasctl.__main__ import main
from kasctl.notify import REFRESH_PATH, run

pytestmark = pytest.mark.timeout(10)


class FakeKasd:
    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.calls: list[tuple[str, str, str, Any, str]] = []

    def __call__(self, api: str, path: str, token: str, ca_pem: bytes | None, *, method: str = "GET",
                 body: dict[str, Any] | None = None, token_header: str = "Job-Token") -> dict[str, Any]:
        self.calls.append((method, path, token, body, token_header))
        if path == REFRESH_PATH:
            return {"projects": []}
        return {"id": "ev/1", "state": self.states.pop(0), "outcome": "done", "attempts": 1, "pod": "agentd-0"}


def _args(*argv: str) -> Any:
    import argparse

    from kasctl import notify
    parser = argparse.ArgumentParser()
    notify.add_command(parser.add_subparsers())
    return parser.parse_args(["notify", *argv])


def test_an_event_is_posted_with_a_personal_token_else_the_jobs_and_wait_polls_until_delivered() -> None:
    kasd, out = FakeKasd(["queued", "delivering", "delivered"]), io.StringIO()
    env = {"KASCTL_API_URL": "https://kas.example", "KASCTL_TOKEN": "pat-secret"}
    code = run(_args("--agent", "1", "--type", "push", "--payload", '{"ref": "main"}', "--id", "ev/1", "--wait"),
               env, call=kasd, out=out, sleep=lambda _s: None)
    assert code == 0 and out.getvalue() == "ev/1 delivered outcome=done attempts=1 pod=agentd-0\n"
    assert kasd.calls[0] == ("POST", "/api/v4/agents/1/events", "pat-secret",
                             {"type": "push", "payload": {"ref": "main"}, "id": "ev/1"}, "PRIVATE-TOKEN")
    assert [c[1] for c in kasd.calls[1:]] == ["/api/v4/agents/1/events/ev%2F1"] * 2
    job = FakeKasd(["queued"])
    assert run(_args("--agent", "1", "--type", "push"), {"KASCTL_API_URL": "https://kas.example",
                                                         "CI_JOB_TOKEN": "job-secret"}, call=job, out=io.StringIO()) == 0
    assert job.calls[0][2:] == ("job-secret", {"type": "push", "payload": None}, "JOB-TOKEN")


def test_bad_input_is_named_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"KASCTL_API_URL": "https://kas.example", "KASCTL_TOKEN": "t"}
    assert run(_args("--agent", "1", "--type", "push", "--payload", "{nope"), env, call=FakeKasd([])) == 2
    assert "--payload is not JSON" in capsys.readouterr().err
    assert run(_args("--agent", "x1", "--type", "push"), env, call=FakeKasd([])) == 2
    assert run(_args("--type", "push"), env, call=FakeKasd([])) == 2
    assert run(_args("--agent", "1", "--type", "push"), {"KASCTL_API_URL": "https://kas.example"},
               call=FakeKasd([])) == 2
    assert "missing token" in capsys.readouterr().err


def test_config_changed_works_as_a_post_receive_hook() -> None:
    kasd, out = FakeKasd([]), io.StringIO()
    hook_input = io.StringIO("0" * 40 + " " + "a" * 40 + " refs/heads/main\n")
    code = run(_args("--config-changed", "--project", "group/infra"), {"KASCTL_API_URL": "https://kas.example",
                                                                       "KASCTL_TOKEN": "t"},
               call=kasd, stdin=hook_input, out=out)
    assert code == 0 and hook_input.read() == ""  # (stdin read whole)
    assert kasd.calls == [("POST", REFRESH_PATH, "t", {"project": "group/infra"}, "PRIVATE-TOKEN")]
    assert "group/infra" in out.getvalue()


def test_config_changed_in_a_ci_job_asks_for_a_personal_token(capsys: pytest.CaptureFixture[str]) -> None:
    """kasd's refresh takes a Developer's personal token: with only the job's token kasctl says so
    (exit 2) instead of sending it to be refused with a bare 401."""
    kasd = FakeKasd([])
    code = run(_args("--config-changed"), {"KASCTL_API_URL": "https://kas.example", "CI_JOB_TOKEN": "job"},
               call=kasd, stdin=io.StringIO(""))
    assert code == 2 and kasd.calls == []
    assert "missing personal token" in capsys.readouterr().err


def test_notify_is_a_kasctl_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["notify", "--help"])
    assert "post-receive" in capsys.readouterr().out
