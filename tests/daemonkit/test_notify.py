"""daemonkit's ready file: checked up front (``ready_file_problem``), and a failure to write it
later is one logged error line, never an exception that would bring the daemon down."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from daemonkit.notify import ready_file_problem, write_ready_file

pytestmark = pytest.mark.timeout(10)


def test_ready_file_problem_names_the_directory(tmp_path: Path) -> None:
    assert ready_file_problem(tmp_path / "ready.json") is None
    assert ready_file_problem(tmp_path / "nodir" / "ready.json") == f"directory {tmp_path / 'nodir'} does not exist"
    (tmp_path / "afile").write_text("")
    assert ready_file_problem(tmp_path / "afile" / "ready.json") == f"{tmp_path / 'afile'} is not a directory"
    assert ready_file_problem(tmp_path) == f"{tmp_path} is a directory"


def test_write_ready_file_writes_json(tmp_path: Path) -> None:
    assert write_ready_file(tmp_path / "ready.json", {"health": "127.0.0.1:1"})
    assert json.loads((tmp_path / "ready.json").read_text()) == {"health": "127.0.0.1:1"}
    assert list(tmp_path.iterdir()) == [tmp_path / "ready.json"]  # no .tmp left behind


def test_write_ready_file_failure_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gone = tmp_path / "gone" / "ready.json"  # say the directory was removed after the check
    with caplog.at_level(logging.ERROR, logger="daemonkit"):
        assert write_ready_file(gone, {"agent": "127.0.0.1:1"}) is False
    [record] = caplog.records
    assert record.getMessage() == f"cannot write ready file path={gone} error=No such file or directory"
