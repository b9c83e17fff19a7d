"""Numbers that strangers and files write as text — agent, project, job and pipeline ids, ports —
parsed strictly, in one place.

Python's own tests let too much through: ``str.isdigit()`` accepts ``²`` (U+00B2, one latin-1 byte
of an HTTP header) that ``int()`` then refuses with a ``ValueError`` nobody expected; ``int()`` accepts
``" 7"``, ``"7_0"``, ``"+7"`` and Arabic-Indic ``"٧"``, and refuses more than 4,300 digits only after
reading them. Here a number is ASCII digits only, checked for length before anything else, and every
refusal is an ``InvalidNumber`` (a ``ValueError``) whose message names what is wrong and quotes at
most a short excerpt of the text. Ids are positive and fit a signed 64-bit integer (GitLab's ids are
``bigint``; SQLite and Redis take them as they are).

Sans-I/O and dependency-free: kasd, agentd, kasctl and ``routing`` all import it (``wire`` is below
each of them).
"""

from __future__ import annotations

from typing import Final

#: the largest id: a signed 64-bit integer, as GitLab's ``bigint`` columns (and SQLite) hold them
MAX_ID: Final = 2**63 - 1
#: the digits of ``MAX_ID``: a longer text is refused before it is looked at
MAX_ID_DIGITS: Final = len(str(MAX_ID))
#: how much of a refused text an error message quotes
_EXCERPT: Final = 20

__all__ = ["MAX_ID", "MAX_ID_DIGITS", "InvalidNumber", "check_id", "parse_decimal", "parse_id"]


class InvalidNumber(ValueError):
    """``text`` is not the number it should be; ``message`` (also ``str()``) says why, names
    ``what`` it was meant to be, and quotes at most a short excerpt of it: safe to show the sender."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _excerpt(text: str) -> str:
    shown = repr(text[:_EXCERPT])
    return f"{shown}…" if len(text) > _EXCERPT else shown


def parse_decimal(text: str, what: str, *, minimum: int = 0, maximum: int = MAX_ID) -> int:
    """``text`` (ASCII digits only: no sign, space, ``_`` or other script's digits) as an int in
    ``minimum..maximum``; ``InvalidNumber`` naming ``what`` otherwise."""
    if not isinstance(text, str):
        raise InvalidNumber(f"{what} must be a number written as text, got {type(text).__name__}")
    if not text:
        raise InvalidNumber(f"{what} is empty: expected a number")
    if len(text) > len(str(maximum)):  # before anything else looks at it
        raise InvalidNumber(f"{what} {_excerpt(text)} is too long: at most {len(str(maximum))} digits")
    if not (text.isascii() and text.isdigit()):
        raise InvalidNumber(f"{what} {_excerpt(text)} is not a number (ASCII digits 0-9 only)")
    value = int(text)
    if not minimum <= value <= maximum:
        raise InvalidNumber(f"{what} {text} is out of range {minimum}-{maximum}")
    return value


def parse_id(text: str, what: str = "id") -> int:
    """An id as text (``"42"``): ASCII digits, no leading zero, 1..``MAX_ID``; ``InvalidNumber``
    naming ``what`` otherwise. One id has one spelling, so ``007`` is refused rather than read as 7."""
    value = parse_decimal(text, what, minimum=1)
    if text[0] == "0":
        raise InvalidNumber(f"{what} {_excerpt(text)} has a leading zero")
    return value


def check_id(value: object, what: str = "id") -> int:
    """An id that arrived already typed (JSON, YAML, msgpack): an ``int`` (not a ``bool``) in
    1..``MAX_ID``; ``InvalidNumber`` naming ``what`` otherwise."""
    if type(value) is not int:
        raise InvalidNumber(f"{what} must be a whole number, got {type(value).__name__}")
    if not 1 <= value <= MAX_ID:
        # str() of a huge int is slow, and refused past 4,300 digits: say its size instead
        shown = str(value) if -(10**20) < value < 10**20 else f"a number of {value.bit_length()} bits"
        raise InvalidNumber(f"{what} must be between 1 and {MAX_ID}, got {shown}")
    return value
