"""The access line is logfmt: a value with spaces or quotes is quoted, so parsers keep it one field."""

from __future__ import annotations

import logging
import shlex

import pytest
import trio

from kasd.k8sproxy.accesslog import RequestRecord


@pytest.mark.parametrize(("subject", "shown"), [
    ("deploy-job", "subject=deploy-job"),
    ("demo CI job", 'subject="demo CI job"'),
    ('say "hi"=x', r'subject="say \"hi\"=x"'),
    ("", "subject=-"),
])
def test_subject_stays_one_field(caplog: pytest.LogCaptureFixture, subject: str, shown: str) -> None:
    caplog.set_level(logging.INFO, logger="kasd.access")

    async def write() -> None:
        RequestRecord(request_id="r1", method="GET", path="/api?x=1", protocol="HTTP/2", peer="127.0.0.1:5",
                      subject=subject).write()

    trio.run(write)
    line = caplog.records[-1].getMessage()
    assert f" {shown} " in line
    fields = dict(field.split("=", 1) for field in shlex.split(line.removeprefix("request ")))
    assert fields["subject"] == (subject or "-") and fields["outcome"] == "ok"
