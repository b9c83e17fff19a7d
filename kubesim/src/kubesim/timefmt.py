"""Timestamps and ages the way the API server writes them, and the clock they are read from.

Each kubesim has a `Clock`: wall-clock time, shifted ahead by what `Clock.advance` added, so a test
can make a minute pass (a CronJob fire) without waiting for it. `serve_kubesim` installs its clock
in a context variable for its own tasks (the HTTP side and the controllers inherit it); `now()`
reads it, and is real time elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta


class Clock:
    """Wall-clock time, moved ahead by `advance` (never back: resourceVersions and timestamps
    would disagree)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        self.offset += timedelta(seconds=seconds)


_CLOCK: ContextVar[Clock | None] = ContextVar("kubesim_clock", default=None)


def install(clock: Clock) -> None:
    """Make `clock` the one `now()` reads in this task and in the tasks it starts from now on."""
    _CLOCK.set(clock)


@contextmanager
def using(clock: Clock) -> Iterator[None]:
    """Read `clock` for the block (code called from outside the server's tasks)."""
    token = _CLOCK.set(clock)
    try:
        yield
    finally:
        _CLOCK.reset(token)


def now() -> datetime:
    clock = _CLOCK.get()
    return datetime.now(UTC) if clock is None else clock.now()


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration, which `kubectl get` prints as AGE."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 60 * 2:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        rest = secs % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = secs // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if rest == 0 else f"{hours // 24 // 365}y{rest}d"
    return f"{hours // 24 // 365}y"


def age(timestamp: str | None, moment: datetime | None = None) -> str:
    then = parse(timestamp)
    if then is None:
        return "<unknown>"
    return human_duration(((moment or now()) - then).total_seconds())
