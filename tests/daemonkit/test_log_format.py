"""log_format: json (one object a line, the message's logfmt pairs as fields, nothing unprintable
raw), and the log settings read again and applied (SIGHUP), or kept with a line saying why."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from agentd.config import load_config as load_agentd_config
from daemonkit.logs import (
    configure_logging,
    current_log_settings,
    reload_log_settings,
    request_context,
)
from daemonkit.settings import SettingsError
from daemonkit.signals import run_until_signalled
from kasd.config import load_config_file as load_kasd_config

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """The root logger writes to this while the test runs (pytest's handlers come back after)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    yield out
    root.handlers[:] = handlers
    root.setLevel(level)


def _objects(out: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_carry_the_messages_pairs_as_fields(stream: io.StringIO) -> None:
    configure_logging("info", stream, log_format="json")
    log = logging.getLogger("kasd.access")
    log.info("request served status=%d path=%s agent=%s", 200, json.dumps("/a b=c"), "7")
    log.warning("signal received signal=%s: reloading", "SIGHUP")  # not pairs at the end: all text
    log.info("forged level=%s", "DEBUG")  # a field never replaces level, time, logger or msg
    log.debug("not shown")
    first, second, third = _objects(stream)
    assert set(first) == {"time", "level", "logger", "msg", "status", "path", "agent"}
    assert first["time"].endswith("Z")
    assert (first["level"], first["logger"], first["msg"]) == ("INFO", "kasd.access", "request served")
    assert (first["status"], first["path"], first["agent"]) == ("200", "/a b=c", "7")
    assert second["msg"] == "signal received signal=SIGHUP: reloading" and second["level"] == "WARNING"
    assert third["msg"] == "forged level=DEBUG" and third["level"] == "INFO"


def test_a_peers_text_cannot_forge_a_json_line(stream: io.StringIO) -> None:
    configure_logging("info", stream, log_format="json")
    hostile = 'x\n{"level": "ERROR"}\r\x1b[2J\u202egnp.exe\u2028y\U000e0001 "q\\'
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("kasd").exception("pod changed name=%s reason=%s", hostile, "\x85")
    text = stream.getvalue()
    assert text.count("\n") == 1
    line = text.removesuffix("\n")
    assert line.isprintable()  # no control, bidi, separator or unassigned character raw
    (record,) = _objects(stream)
    assert record["msg"] == f"pod changed name={hostile} reason=\x85"  # all of it, faithfully
    assert record["level"] == "ERROR" and "ValueError: boom" in record["exc_info"]


def test_logfmt_stays_the_default(stream: io.StringIO) -> None:
    configure_logging("info", stream)
    logging.getLogger("kasd").info("ready x=%s", "a\nb")
    assert stream.getvalue().endswith(" level=INFO logger=kasd ready x=a\\nb\n")
    assert current_log_settings() == ("info", "logfmt")


def test_reload_applies_level_and_format_or_keeps_them_with_a_line(stream: io.StringIO) -> None:
    configure_logging("info", stream)
    log = logging.getLogger("kasd")
    assert reload_log_settings(lambda: ("debug", "json"), log)
    assert current_log_settings() == ("debug", "json")
    assert _objects(stream)[-1]["msg"] == "log level now debug"

    def bad() -> tuple[str, str]:
        raise SettingsError("/etc/kasd.yaml: log_level: must be one of debug, info, warning, error, got 'loud'")

    assert not reload_log_settings(bad, log)
    assert current_log_settings() == ("debug", "json")
    assert _objects(stream)[-1]["msg"] == (
        "log settings not reloaded: /etc/kasd.yaml: log_level: must be one of debug, info, warning, error, "
        "got 'loud'; log level stays debug")
    assert reload_log_settings(lambda: ("warning", "logfmt"), log)  # said before it goes quiet
    assert stream.getvalue().endswith("logger=kasd log level now warning log_format=logfmt\n")
    log.info("hidden")
    assert "hidden" not in stream.getvalue()


def test_log_format_is_a_setting_of_both_daemons(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    agentd = ["--kas-address", "http://kas:8150/tunnel", "--token-file", str(tmp_path / "token"), "--kubeconfig", str(tmp_path / "kubeconfig")]
    assert load_agentd_config(agentd, {}).log_format == "logfmt"
    assert load_agentd_config([*agentd, "--log-format", "JSON"], {}).log_format == "json"
    with pytest.raises(SettingsError, match=r"AGENTD_LOG_FORMAT: must be one of logfmt, json, got 'xml'"):
        load_agentd_config(agentd, {"AGENTD_LOG_FORMAT": "xml"})
    (tmp_path / "kasd.yaml").write_text("log_format: json\n")
    assert load_kasd_config(["--config", str(tmp_path / "kasd.yaml")], {})[0].log_format == "json"
    with pytest.raises(SettingsError, match=r"--log-format: log_format: must be one of logfmt, json, got 'text'"):
        load_kasd_config(["--log-format", "text"], {})


class _Said(logging.Handler):
    """Sets (thread-safely: the reload writes from a worker thread) an event per line containing ``text``."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        super().__init__()
        self.token = token
        self.waiting: dict[str, trio.Event] = {}

    def expect(self, text: str) -> trio.Event:
        self.waiting[text] = trio.Event()
        return self.waiting[text]

    def emit(self, record: logging.LogRecord) -> None:
        for text, event in self.waiting.items():
            if text in record.getMessage():
                self.token.run_sync_soon(event.set)


async def test_sighup_reads_the_log_level_again(stream: io.StringIO, tmp_path: Path) -> None:
    configure_logging("info", stream)
    config = tmp_path / "agentd.yaml"
    token = tmp_path / "token"
    token.write_text("t\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    args = ["--config", str(config), "--kas-address", "http://kas:8150/tunnel", "--token-file", str(token), "--kubeconfig", str(tmp_path / "kubeconfig")]
    config.write_text("log_level: info\n")

    def log_settings() -> tuple[str, str]:  # as agentd's main reads them
        again = load_agentd_config(args, {})
        return again.log_level, again.log_format

    async def main(drain: trio.Event) -> None:
        await drain.wait()

    log = logging.getLogger("agentd")
    said = _Said(trio.lowlevel.current_trio_token())
    log.addHandler(said)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(run_until_signalled, main, log=log, log_settings=log_settings))
                config.write_text("log_level: debug\n")
                changed = said.expect("log level now")
                os.kill(os.getpid(), signal.SIGHUP)
                await changed.wait()
                assert current_log_settings() == ("debug", "logfmt")
                config.write_text("log_level: loud\n")
                refused = said.expect("not reloaded")
                os.kill(os.getpid(), signal.SIGHUP)
                await refused.wait()
                os.kill(os.getpid(), signal.SIGTERM)
    finally:
        log.removeHandler(said)
    assert current_log_settings()[0] == "debug"
    assert "logger=agentd log level now debug log_format=logfmt\n" in stream.getvalue()
    assert (f"log settings not reloaded: log_level in {config}: must be one of debug, info, warning, error, "
            "got 'loud'; log level stays debug log_format=logfmt") in stream.getvalue()


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_every_line_logged_for_a_request_names_its_id(stream: io.StringIO, log_format: str) -> None:
    configure_logging("info", stream, log_format=log_format)
    log = logging.getLogger("kasd.k8sproxy")
    with request_context("3f2a-req"):
        log.warning("agent stream broke mid-response error=%s", "reset")
        log.info("request request_id=%s status=200", "3f2a-req")  # names it itself: not twice
    log.info("session closed agent_id=7")  # no request: nothing added
    lines = stream.getvalue().splitlines()
    if log_format == "json":
        first, second, third = (json.loads(line) for line in lines)
        assert first["request_id"] == "3f2a-req" and first["msg"] == "agent stream broke mid-response"
        assert second["request_id"] == "3f2a-req" and "request_id" not in third
    else:
        assert lines[0].endswith("error=reset request_id=3f2a-req")
        assert lines[1].count("request_id=") == 1 and "request_id" not in lines[2]


async def test_a_task_a_request_starts_elsewhere_is_not_about_the_request(stream: io.StringIO) -> None:
    """A long-lived task that a request happens to start in a service's nursery (a peer session
    dialled for the first forwarded request) inherits the request's context, but its lines are not
    about that request; a task the request starts in its own nursery is."""
    configure_logging("info", stream)
    log = logging.getLogger("routing.peers")

    async def say(what: str) -> None:
        log.info("%s", what)

    async with trio.open_nursery() as service:

        async def serve_request() -> None:  # as a front end serves each request: a task of its own
            with request_context("req-9"):
                async with trio.open_nursery() as own:
                    own.start_soon(say, "relay step")
                    service.start_soon(say, "peer session closed")

        service.start_soon(serve_request)
    lines = sorted(stream.getvalue().splitlines())
    assert lines[0].endswith("peer session closed") and lines[1].endswith("relay step request_id=req-9")
