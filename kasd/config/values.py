"""Parsers of one setting's value, shared by the sections of kasd's configuration.

Each takes what the file, a variable or a flag gave and returns the value, or raises ``Problem``
with what is wrong (``daemonkit.settings`` adds the key, variable or flag).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from daemonkit import yamldoc
from daemonkit.settings import HostPort, Problem
from wire.ids import MAX_ID, InvalidNumber, check_id, parse_decimal


def expect_type(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise Problem(f"must be {what}, got {yamldoc.describe(value)}")
    if not isinstance(value, kind):
        raise Problem(f"must be {what}, got {yamldoc.describe(value)}")
    return value


def parse_string(value: Any) -> str:
    return expect_type(value, str, "a string")  # type: ignore[no-any-return]


def parse_address(value: Any) -> HostPort:
    """``host:port`` (``[v6]:port`` too); port 0 picks a free port."""
    text = expect_type(value, str, "a host:port string")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise Problem(f"{text!r} is not host:port (e.g. 0.0.0.0:8154)")
    try:
        port = parse_decimal(port_text, "port", maximum=65535)
    except InvalidNumber as exc:
        raise Problem(exc.message) from None
    return HostPort(host.strip("[]"), port)


def parse_seconds(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise Problem(f"{value!r} is not a number of seconds") from None
    seconds = float(expect_type(value, (int, float), "a number of seconds"))
    if not math.isfinite(seconds):  # NaN passes `<= 0`, and trio refuses a NaN deadline per connection
        raise Problem(f"must be a finite number of seconds, got {value!r}")
    if seconds <= 0:
        raise Problem(f"must be greater than 0 seconds, got {value!r}")
    return seconds


def parse_boolean(value: Any) -> bool:
    """``true``/``false`` in the file; the same words (any case) in a variable."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise Problem(f"must be true or false, got {value!r}")


def parse_existing_file(value: Any) -> Path:
    path = Path(expect_type(value, str, "a file path"))
    if not path.is_file():
        raise Problem(f"file {str(path)!r} does not exist")
    return path


def parse_count(value: Any) -> int:
    """A whole number of at least 1: an int from the file (not a bool), or its text from env and flags."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = parse_decimal(value.strip(), "the number")
        except InvalidNumber:
            number = None
    if number is None:
        raise Problem(f"must be a whole number, got {value!r}")
    if number < 1:
        raise Problem(f"must be at least 1, got {number}")
    return number


def parse_positive_id(value: Any) -> int:
    agent_id = expect_type(value, int, "a positive integer")
    if agent_id <= 0:
        raise Problem(f"must be a positive integer, got {agent_id}")
    try:
        return check_id(agent_id)  # GitLab's ids are bigint: what a token or a database can carry
    except InvalidNumber:
        raise Problem(f"must be at most {MAX_ID} (a signed 64-bit integer)") from None


def parse_strings(value: Any, at: str) -> tuple[str, ...]:
    if value is None:
        return ()
    try:
        items = expect_type(value, list, "a list of strings")
    except Problem as problem:
        raise Problem(problem.text, at=at) from None
    for i, item in enumerate(items):
        try:
            expect_type(item, str, "a string")
        except Problem as problem:
            raise Problem(problem.text, at=f"{at}[{i}]") from None
    return tuple(items)


def parse_existing_dir(value: Any) -> Path | None:
    if value is None:
        return None
    path = Path(expect_type(value, str, "a directory path"))
    if not path.is_dir():
        raise Problem(f"directory {str(path)!r} does not exist")
    return path
