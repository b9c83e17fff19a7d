"""Cron schedules (kubesim.cron): parsing as robfig/cron's standard parser, and next/most recent
activation times checked against a minute-by-minute walk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim import cron


def brute_next(schedule: cron.Schedule, moment: datetime, zone=UTC) -> datetime:  # type: ignore[no-untyped-def]
    t = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while True:
        local = t.astimezone(zone)
        dom, dow = local.day in schedule.days, (local.isoweekday() % 7) in schedule.weekdays
        day = (dom and dow) if (schedule.days_star or schedule.weekdays_star) else (dom or dow)
        if not day or local.month not in schedule.months:  # the whole (UTC) day is out
            t = t.replace(hour=0, minute=0) + timedelta(days=1)
            continue
        if local.minute in schedule.minutes and local.hour in schedule.hours:
            return t
        t += timedelta(minutes=1)


def test_fields_ranges_steps_names_and_descriptors() -> None:
    s = cron.parse("*/15 9-17 * JAN-MAR mon-fri")
    assert s.minutes == {0, 15, 30, 45} and s.hours == set(range(9, 18))
    assert s.months == {1, 2, 3} and s.weekdays == {1, 2, 3, 4, 5}
    assert cron.parse("0 0 * * 7").weekdays == {0}
    assert cron.parse("5/20 * * * *").minutes == {5, 25, 45}
    assert cron.parse("@hourly") == cron.parse("0 * * * *")
    assert cron.parse("@daily") == cron.parse("0 0 * * *") == cron.parse("@midnight")


@pytest.mark.parametrize(("text", "message"), [
    ("* * * *", "expected exactly 5 fields, found 4: [* * * *]"),
    ("60 * * * *", "end of range (60) above maximum (59): 60"),
    ("x * * * *", 'failed to parse int from x: strconv.Atoi: parsing "x": invalid syntax'),
    ("*/0 * * * *", "step of range should be a positive number: */0"),
    ("5-1 * * * *", "beginning of range (5) beyond end of range (1): 5-1"),
    ("@every 5m", "unrecognized descriptor: @every 5m"),
])
def test_bad_schedules_say_why(text: str, message: str) -> None:
    with pytest.raises(cron.ScheduleError) as info:
        cron.parse(text)
    assert str(info.value) == message


def test_next_after_and_most_recent() -> None:
    every = cron.parse("* * * * *")
    t = datetime(2026, 1, 1, 10, 0, 30, tzinfo=UTC)
    assert every.next_after(t) == datetime(2026, 1, 1, 10, 1, tzinfo=UTC)
    # only the most recent missed time is started; a year behind costs no walk over every minute
    assert every.most_recent(t - timedelta(days=365), t) == datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert every.most_recent(t, t + timedelta(seconds=29)) is None
    assert cron.parse("0 0 30 2 *").next_after(t) is None  # never fires
    berlin = ZoneInfo("Europe/Berlin")
    assert cron.parse("0 9 * * *").next_after(t, berlin) == datetime(2026, 1, 2, 8, 0, tzinfo=UTC)


def test_daylight_saving_changes() -> None:
    """The next activation is always after the moment asked about. In the hour a fall-back
    repeats it used to be an hour in the past (the wall time's first pass), so the controller's
    wake-up was in the past and it spun for that hour, and minute schedules skipped the repeat;
    robfig steps in real minutes and fires in both passes."""
    york = ZoneInfo("America/New_York")
    every = cron.parse("* * * * *")
    second_pass = datetime(2026, 11, 1, 6, 45, tzinfo=UTC)  # 01:45 EST, after 01:45 EDT
    assert every.next_after(second_pass, york) == datetime(2026, 11, 1, 6, 46, tzinfo=UTC)
    assert cron.parse("46 1 * * *").next_after(second_pass, york) == datetime(2026, 11, 1, 6, 46, tzinfo=UTC)
    assert cron.parse("30 1 * * *").next_after(datetime(2026, 11, 1, 5, 30, tzinfo=UTC), york) == (
        datetime(2026, 11, 1, 6, 30, tzinfo=UTC))
    fired, t = [], datetime(2026, 11, 1, 4, 59, tzinfo=UTC)
    while (t := every.next_after(t, york)) < datetime(2026, 11, 1, 7, 0, tzinfo=UTC):
        fired.append(t)
    assert fired == [datetime(2026, 11, 1, 5, 0, tzinfo=UTC) + timedelta(minutes=i) for i in range(120)]
    assert every.most_recent(datetime(2026, 11, 1, 5, 0, tzinfo=UTC),
                             datetime(2026, 11, 1, 6, 45, 30, tzinfo=UTC), york) == second_pass
    # a wall time the spring-forward skips happens as Go's time.Date places it: 02:30 is 03:30 EDT
    assert cron.parse("30 2 * * *").next_after(datetime(2026, 3, 8, 5, 0, tzinfo=UTC), york) == (
        datetime(2026, 3, 8, 7, 30, tzinfo=UTC))


@settings(max_examples=60, deadline=None)
@given(minute=st.sampled_from(["*", "*/7", "0", "5,35", "10-20/5"]),
       hour=st.sampled_from(["*", "1", "2", "*/6"]),
       zone=st.sampled_from(["America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]),
       offset=st.integers(0, 4 * 24 * 60))
def test_next_after_is_after_around_daylight_saving_changes(minute: str, hour: str, zone: str,
                                                            offset: int) -> None:
    schedule = cron.parse(f"{minute} {hour} * * *")
    start = datetime(2026, 10, 31, tzinfo=UTC) + timedelta(minutes=offset, seconds=17)
    found = schedule.next_after(start, ZoneInfo(zone))
    assert found is not None and start < found <= start + timedelta(days=1, hours=2)


@settings(max_examples=60, deadline=None)
@given(minute=st.sampled_from(["*", "*/7", "0", "5,35", "10-20/5"]),
       hour=st.sampled_from(["*", "3", "*/6", "22-23"]),
       dom=st.sampled_from(["*", "1", "15-17", "?"]),
       month=st.sampled_from(["*", "2", "6-8"]),
       dow=st.sampled_from(["*", "0", "mon-wed", "?"]),
       offset=st.integers(0, 366 * 24 * 60))
def test_next_after_agrees_with_a_minute_walk(minute: str, hour: str, dom: str, month: str,
                                              dow: str, offset: int) -> None:
    schedule = cron.parse(f"{minute} {hour} {dom} {month} {dow}")
    start = datetime(2025, 3, 1, tzinfo=UTC) + timedelta(minutes=offset, seconds=17)
    assert schedule.next_after(start) == brute_next(schedule, start)
