"""The demo's guide prints commands that work in a new terminal of the user's: bare `kasctl` only when
the PATH the user started scripts/demo.sh with finds this very kasctl, else its full path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kasctl.__main__ as demo

HERE = Path(sys.executable).parent


def test_kasctl_is_printed_by_its_full_path_when_the_users_own_path_lacks_the_venv(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # scripts/demo.sh activated .venv for itself: this process's PATH finds kasctl, the user's does not
    monkeypatch.setenv("PATH", f"{HERE}:/usr/bin:/bin")
    monkeypatch.setenv("KASCTL_DEMO_USER_PATH", f"{tmp_path}:/usr/bin:/bin")
    assert demo._kasctl() == str(HERE / "kasctl")


def test_kasctl_is_printed_bare_when_the_users_path_finds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KASCTL_DEMO_USER_PATH", f"{HERE}:/usr/bin:/bin")
    assert demo._kasctl() == "kasctl"


def test_without_the_demo_scripts_word_this_path_decides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KASCTL_DEMO_USER_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert demo._kasctl() == str(HERE / "kasctl")
