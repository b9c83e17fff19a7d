"""A real browser for the dashboard's tests: Debian's chromium (``/usr/bin/chromium``) driven by
playwright's sync API — never playwright's own downloaded browser. scripts/test.sh installs both
when absent, on CI or with KASD_TEST_INSTALL=1; elsewhere the tests are skipped, saying what is missing,
and on CI (or when installing was asked for) a missing browser fails them instead."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def missing() -> str | None:
    """What is missing to run a browser test, or None."""
    lacks = []
    if not Path(CHROMIUM).is_file():
        lacks.append(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        lacks.append("no playwright Python package (pip install playwright; its own browsers are not needed)")
    if not lacks:
        return None
    return ("browser tests: " + "; ".join(lacks)
            + " — scripts/test.sh installs them with KASD_TEST_INSTALL=1 (CI always runs these tests)")


def must_run() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("KASD_TEST_INSTALL") == "1"


needs_browser = pytest.mark.skipif(missing() is not None and not must_run(), reason=missing() or "")
"""Skipped, naming what is missing, where there is no browser; never skipped on CI (it fails there)."""
