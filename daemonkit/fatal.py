"""The errors that end a daemon, as the one line each that it prints on stderr (never a traceback)."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


def leaves(group: BaseExceptionGroup[E]) -> list[E]:
    """Every exception in ``group``, however deeply Trio's nurseries nested it."""
    found: list[E] = []
    for exc in group.exceptions:
        found.extend(leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def os_error_line(exc: OSError) -> str:
    """What an OSError says: its message (a listener's names the listener), and the file, if any."""
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename is not None else reason
