"""BurstLimitedLog: a line repeated in a burst is written once per interval, with a count."""

from __future__ import annotations

import logging

import pytest

from daemonkit.logs import BurstLimitedLog, UnexpectedErrors


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.burst"]


def test_a_burst_is_one_line_then_a_count(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.INFO)
    burst = BurstLimitedLog(logging.getLogger("test.burst"), interval=10, clock=clock)
    assert burst.warning("10.0.0.1", "refused peer=%s", "10.0.0.1:1")
    for port in range(2, 1002):
        clock.now += 0.001
        assert not burst.warning("10.0.0.1", "refused peer=%s", f"10.0.0.1:{port}")
    assert _lines(caplog) == ["refused peer=10.0.0.1:1"]
    clock.now += 10
    burst.warning("10.0.0.1", "refused peer=%s", "10.0.0.1:5000")
    assert _lines(caplog)[-1] == "refused peer=10.0.0.1:5000 suppressed=1000"


def test_keys_are_limited_separately(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.INFO)
    burst = BurstLimitedLog(logging.getLogger("test.burst"), interval=10, clock=clock)
    burst.info("a", "line %s", "a")
    burst.info("b", "line %s", "b")
    burst.info("a", "line %s", "a2")
    assert _lines(caplog) == ["line a", "line b"]


def test_flush_writes_what_was_held(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.INFO)
    burst = BurstLimitedLog(logging.getLogger("test.burst"), interval=10, clock=clock)
    burst.info("k", "reset streams peer=%s", "p")
    burst.info("k", "reset streams peer=%s", "p")
    burst.info("k", "reset streams peer=%s", "p")
    burst.flush()
    burst.flush()  # nothing left: no second line
    assert _lines(caplog) == ["reset streams peer=p", "reset streams peer=p suppressed=2"]


def test_keys_are_bounded(caplog: pytest.LogCaptureFixture, clock: Clock) -> None:
    caplog.set_level(logging.INFO)
    burst = BurstLimitedLog(logging.getLogger("test.burst"), interval=10, max_keys=4, clock=clock)
    for n in range(100):
        burst.info(n, "peer %d", n)
        burst.info(n, "peer %d", n)  # held
    assert len(burst._held) <= 4
    # every held line was counted when its key was pushed out
    assert sum(1 for line in _lines(caplog) if line.endswith("suppressed=1")) == 96


def _fail(where: str, secret: str) -> Exception:
    try:
        if where == "int":
            int(secret)
        raise KeyError(secret)
    except Exception as exc:  # a test's stand-in for a bug
        return exc


def test_unexpected_errors_are_one_line_per_kind_without_their_message(caplog: pytest.LogCaptureFixture,
                                                                       clock: Clock) -> None:
    caplog.set_level(logging.INFO)
    counted = {"errors": 0, "suppressed": 0}
    unexpected = UnexpectedErrors(logging.getLogger("test.burst"), interval=60, clock=clock,
                                  on_error=lambda: counted.__setitem__("errors", counted["errors"] + 1),
                                  on_suppressed=lambda: counted.__setitem__("suppressed", counted["suppressed"] + 1))
    for _ in range(100):
        unexpected.report(_fail("int", "ci:²:secret"), "request failed id=%s", 1)
    unexpected.report(_fail("key", "secret"), "request failed id=%s", 2)  # another kind: its own line
    clock.now += 60
    unexpected.report(_fail("int", "ci:²:secret"), "request failed id=%s", 3)
    lines = _lines(caplog)
    assert len(lines) == 3 and all(r.levelno == logging.ERROR and not r.exc_info for r in caplog.records)
    assert lines[0].startswith("request failed id=1 error=ValueError trace=\"test_logs.py:")
    assert "_fail" in lines[0] and "KeyError" in lines[1] and lines[2].endswith("suppressed=99")
    assert "secret" not in caplog.text
    assert counted == {"errors": 102, "suppressed": 99}


def test_a_value_from_a_peer_cannot_forge_a_log_line_or_reach_a_terminal() -> None:
    """An agent's pod name (a HELLO field), an event's detail, anything a peer sends that ends up in
    a message: newlines, carriage returns, terminal escapes and bidi overrides are shown escaped, so
    one record is one line of the daemon's format; a traceback keeps its lines."""
    import io

    from daemonkit.logs import configure_logging

    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("info", out)
        forged = "web-1\ntime=2026-01-01T00:00:00Z level=INFO logger=kasd.agents agent connected agent_id=9"
        logging.getLogger("test.inject").info("agent connected pod=%s", forged)
        logging.getLogger("test.inject").info("pod=%s", "a\rb\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\u2028x\x00y")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("test.inject").exception("failed pod=%s", "p\nq")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("logger=test.inject agent connected pod=web-1\\ntime=2026-01-01T00:00:00Z level=INFO "
                             "logger=kasd.agents agent connected agent_id=9")
    assert lines[1].endswith(r"pod=a\rb\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\u2028x\x00y")
    assert lines[2].endswith(r"failed pod=p\nq") and lines[3] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"
