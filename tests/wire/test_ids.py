"""The one strict parser of numbers written as text: ASCII digits only, length checked first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire.ids import MAX_ID, InvalidNumber, check_id, parse_decimal, parse_id

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("text", "problem"), [
    ("²", "is not a number"),  # str.isdigit() says yes, int() says no
    ("٣", "is not a number"),  # int() reads it as 3
    (" 7", "is not a number"), ("7_0", "is not a number"), ("+7", "is not a number"), ("-7", "is not a number"),
    ("", "is empty"),
    ("7" * 5000, "is too long"),  # int() would read 4,300 digits before refusing
    (str(MAX_ID + 1), "out of range"),
    ("0", "out of range"),
    ("007", "leading zero"),
])
def test_what_is_not_an_id_is_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(InvalidNumber) as caught:
        parse_id(text, "agent id")
    assert caught.value.message.startswith("agent id") and problem in caught.value.message
    assert len(caught.value.message) < 120  # a short excerpt, never the whole text


@given(st.text(max_size=30))
def test_any_text_is_an_id_or_an_invalid_number(text: str) -> None:
    try:
        value = parse_id(text)
    except InvalidNumber:
        return
    assert str(value) == text and 1 <= value <= MAX_ID


def test_ids_that_are_ids() -> None:
    assert parse_id("1") == 1 and parse_id(str(MAX_ID)) == MAX_ID
    assert parse_decimal("0080", "port", maximum=65535) == 80
    assert check_id(42) == 42
    for value in (True, 0, -1, MAX_ID + 1, 10**5000, 4.0, "42"):
        with pytest.raises(InvalidNumber):
            check_id(value)
