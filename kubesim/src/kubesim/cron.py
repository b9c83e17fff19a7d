"""Cron schedules as the CronJob controller reads them (robfig/cron/v3's standard parser).

Five fields — minute, hour, day of month, month, day of week — each `*` (or `?`), a value, a range
`a-b`, a step `*/n` or `a-b/n` or `a/n`, or a comma list of those; month names JAN-DEC and day
names SUN-SAT (7 is Sunday too); and the descriptors @yearly (@annually), @monthly, @weekly,
@daily (@midnight), @hourly. As in robfig/cron, when both day fields are restricted (neither
starts with `*` or `?`) a day matches either, else both must match. Times are computed in the
CronJob's `timeZone` (UTC when unset), as the controller does.

Bounded: a schedule string is at most `MAX_SCHEDULE` characters, and every search for the next
time gives up after five years of calendar (a schedule such as `0 0 30 2 *` never fires).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs

MAX_SCHEDULE = 1024
_SEARCH_YEARS = 5

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: i + 1 for i, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


class ScheduleError(ValueError):
    """The schedule does not parse; the message is worded as robfig/cron's."""


@attrs.frozen
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    #: whether the day-of-month / day-of-week field was `*` or `?` (robfig's star bit)
    days_star: bool
    weekdays_star: bool

    def _day_matches(self, moment: datetime) -> bool:
        dom = moment.day in self.days
        dow = (moment.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return dom and dow
        return dom or dow

    def next_after(self, moment: datetime, zone: tzinfo = UTC) -> datetime | None:
        """The first activation strictly after `moment` (aware), in UTC; None if there is none
        within five years (as robfig's Next gives the zero time).

        Wall times are matched in `zone`. One skipped by a spring-forward gap happens as Go's
        time.Date places it (the offset before the change: 02:30 becomes 03:30); one repeated by
        a fall-back happens at both instants, as robfig, stepping in real minutes, fires in
        either pass. So the search starts two hours of wall time early (a repeated wall time may
        lie before `moment`'s), and takes the earliest instant after `moment`."""
        local = moment.astimezone(zone).replace(second=0, microsecond=0, tzinfo=None, fold=0)
        lookback = timedelta(0) if zone is UTC else timedelta(hours=2)
        t = local - lookback + timedelta(minutes=1)
        limit = local.year + _SEARCH_YEARS
        best: datetime | None = None
        while (wall := self._next_wall_time(t, limit)) is not None:
            if best is not None and wall > best.astimezone(zone).replace(tzinfo=None) + lookback:
                break
            for instant in _instants(wall, zone):
                if instant > moment and (best is None or instant < best):
                    best = instant
            t = wall + timedelta(minutes=1)
        return best

    def _next_wall_time(self, t: datetime, limit: int) -> datetime | None:
        """The first naive wall time at or after `t` that the schedule matches (year <= limit)."""
        while t.year <= limit:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
                continue
            if not self._day_matches(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t += timedelta(minutes=1)
                continue
            return t
        return None

    def most_recent(self, earliest: datetime, now: datetime, zone: tzinfo = UTC) -> datetime | None:
        """The latest activation in (earliest, now], or None: what the controller starts a Job
        for (getMostRecentScheduleTime; missed earlier activations are skipped as there)."""
        if now <= earliest:
            return None
        # Look back over growing windows so an old `earliest` costs no walk over every minute.
        for window in (timedelta(hours=1), timedelta(days=2), timedelta(days=62),
                       timedelta(days=800), None):
            start = earliest if window is None else max(earliest, now - window)
            found = None
            t = self.next_after(start, zone)
            while t is not None and t <= now:
                found = t
                t = self.next_after(t, zone)
            if found is not None or start == earliest:
                return found
        return None


def _instants(wall: datetime, zone: tzinfo) -> list[datetime]:
    """The UTC instants a naive wall time names in `zone`: one, or two in a repeated hour."""
    first = wall.replace(tzinfo=zone).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if second != first and second.astimezone(zone).replace(tzinfo=None) == wall:
        return [first, second]
    return [first]


def parse(text: str) -> Schedule:
    if len(text) > MAX_SCHEDULE:
        raise ScheduleError(f"schedule longer than {MAX_SCHEDULE} characters")
    spec = text.strip()
    if spec.startswith("@"):
        if spec not in _DESCRIPTORS:
            raise ScheduleError(f"unrecognized descriptor: {spec}")
        spec = _DESCRIPTORS[spec]
    fields = spec.split()
    if len(fields) != 5:
        raise ScheduleError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    minute, hour, dom, month, dow = fields
    weekdays = _field(dow, 0, 7, _DAYS)
    if 7 in weekdays:
        weekdays = (weekdays - {7}) | {0}
    return Schedule(
        minutes=_field(minute, 0, 59), hours=_field(hour, 0, 23), days=_field(dom, 1, 31),
        months=_field(month, 1, 12, _MONTHS), weekdays=weekdays,
        days_star=dom[:1] in ("*", "?"), weekdays_star=dow[:1] in ("*", "?"))


def _number(text: str, names: dict[str, int] | None) -> int:
    if names and text.lower() in names:
        return names[text.lower()]
    if not text.isdigit():
        raise ScheduleError(f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def _field(text: str, low: int, high: int, names: dict[str, int] | None = None) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        expression, slash, step_text = part.partition("/")
        step = 1
        if slash:
            step = _number(step_text, None)
            if step == 0:
                raise ScheduleError(f"step of range should be a positive number: {part}")
        if expression in ("*", "?"):
            start, end = low, high
        else:
            first, dash, last = expression.partition("-")
            start = _number(first, names)
            end = _number(last, names) if dash else (high if slash else start)
        if start < low:
            raise ScheduleError(f"beginning of range ({start}) below minimum ({low}): {part}")
        if end > high:
            raise ScheduleError(f"end of range ({end}) above maximum ({high}): {part}")
        if start > end:
            raise ScheduleError(f"beginning of range ({start}) beyond end of range ({end}): {part}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def zone(name: str | None) -> tzinfo:
    """The CronJob's `timeZone` (UTC when unset); ValueError when unknown."""
    if not name or name in ("UTC", "Etc/UTC"):
        return UTC
    if len(name) > 255 or name.startswith(("/", ".")) or ".." in name:
        raise ValueError(f"unknown time zone {name}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name}") from None
