"""docs/operations.md cannot drift from the code: every metric it names is one the daemons export,
and every log line its troubleshooting section quotes is a message the code writes, under the logger
the line shows. (The lines were copied from a running demo stack; a renamed message or metric must
move the guide with it.)"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "operations.md"
PRODUCT = ("wire", "netio", "http11", "tunnelhttp", "h2trio", "daemonkit", "routing", "kasd", "agentd", "kasctl")
TROUBLESHOOTING = "## Troubleshooting: which of the four it is"

#: a metric as a document names it: the family, and a sample suffix Prometheus adds
_METRIC = re.compile(r"\b((?:kasd|agentd)_[a-z0-9_]*[a-z0-9])")
_SUFFIX = re.compile(r"_(total|bucket|sum|count|created)$")
#: a logfmt line as quoted: ``… logger=NAME message words key=value …``
_LOG_LINE = re.compile(r"\blogger=(?P<logger>[\w.]+) (?P<rest>.*)")


@cache
def _sources() -> dict[str, str]:
    """Each product module's text, by its dotted name."""
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path.read_text(encoding="utf-8")
    return found


def undeclared_metrics(text: str) -> list[str]:
    """The metric names in ``text`` that no product module declares (as a string literal)."""
    missing = []
    for name in sorted(set(_METRIC.findall(text))):
        family = _SUFFIX.sub("", name)
        if not any(f'"{family}"' in source or f'"{name}"' in source for source in _sources().values()):
            missing.append(name)
    return missing


def _message(rest: str) -> str:
    """The message of a logfmt line: its words before the first ``key=value``."""
    words = []
    for word in rest.split(" "):
        if "=" in word:
            break
        words.append(word)
    return " ".join(words)


def unwritten_log_lines(text: str) -> list[str]:
    """The quoted log lines of ``text`` whose message no module of their logger writes: the module
    must hold the message as the start of a string literal and be that logger (its dotted name) or
    name it (``logging.getLogger("kasd.access")``)."""
    missing = []
    for line in text.splitlines():
        match = _LOG_LINE.search(line)
        if match is None:
            continue
        logger, message = match["logger"], _message(match["rest"])
        written = [name for name, source in _sources().items()
                   if re.search(r"[\"']" + re.escape(message) + r"[ \"']", source)
                   and (name == logger or f'"{logger}"' in source)]
        if not message or not written:
            missing.append(line.strip())
    return missing


def _troubleshooting() -> str:
    guide = GUIDE.read_text(encoding="utf-8")
    assert TROUBLESHOOTING in guide, f"docs/operations.md has no section {TROUBLESHOOTING!r}"
    section = guide.split(TROUBLESHOOTING, 1)[1]
    return section.split("\n## ", 1)[0]


def test_every_metric_the_guide_names_is_exported() -> None:
    assert undeclared_metrics(GUIDE.read_text(encoding="utf-8")) == []


def test_every_log_line_the_troubleshooting_section_quotes_is_written_by_the_code() -> None:
    section = _troubleshooting()
    quoted = [line for line in section.splitlines() if _LOG_LINE.search(line)]
    # the four cases, each with its lines on both sides
    assert len(quoted) >= 12
    for case in ("### Agent not connected", "### kasd unreachable", "### Not allowed", "### API server down"):
        assert case in section
    assert unwritten_log_lines(section) == []


def test_a_drifted_name_is_caught() -> None:
    """The checks are not vacuous: a renamed metric and a reworded message fail them."""
    assert undeclared_metrics("watch `kasd_connected_agents` and `kasd_agents_connected_total`") == [
        "kasd_agents_connected_total"]
    ok = "level=WARNING logger=agentd.connection dial failed url=x slot=0 failures=1 error='x' retry_in=1s"
    reworded = "level=WARNING logger=agentd.connection dialing failed url=x slot=0"
    wrong_logger = "level=WARNING logger=kasd.access dial failed url=x slot=0"
    assert unwritten_log_lines("\n".join([ok, reworded, wrong_logger])) == [reworded, wrong_logger]
