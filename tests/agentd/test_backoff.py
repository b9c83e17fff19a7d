"""The connection manager's dialing: its reconnect schedule (``agentd.redial``, sans-I/O: at most 2 s
between dials for an outage's first minute, then exponential; a refused token or a flapping kasd
backed off from), and the manager following it — under ``autojump_clock`` with a fake dialer."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from agentd.connection import Backoff, ConnectionManager
from agentd.redial import RedialSchedule
from wire.carrier import TunnelRejectedError

pytestmark = pytest.mark.timeout(10)


class MaxRandom(random.Random):
    """Always the top of the range, recording the ranges asked for."""

    def __init__(self) -> None:
        super().__init__(0)
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return b


def waits_while_down(schedule: RedialSchedule, rand: random.Random, start: float, first: float,
                     until: float) -> list[float]:
    """The waits of a slot whose dials fail from ``start`` (after a first wait ``first``) until ``until``."""
    waits, now = [first], start + first
    while now < until:
        waits.append(schedule.after_failure(now, rand))
        now += waits[-1]
    return waits


def test_a_young_outage_waits_at_most_two_seconds_then_doubles_up_to_a_minute() -> None:
    schedule, rand = RedialSchedule(), MaxRandom()
    first = schedule.after_drop(100.0, 40.0, rand)  # a tunnel up 40 s drops at t=100
    waits = waits_while_down(schedule, rand, 100.0, first, 100.0 + 240)
    # 1, then 2 s after each of the dials at t=101, 103 … 159, then (t=161: a minute old) 4, 8 … 60
    assert waits[:32] == [1.0] + [2.0] * 30 + [4.0]
    assert waits[32:37] == [8.0, 16.0, 32.0, 60.0, 60.0]
    assert rand.ranges[:3] == [(0.0, 1.0), (0.0, 2.0), (0.0, 2.0)]  # full jitter: from 0
    # an agentd that starts while kasd is away is in an outage as well
    fresh = RedialSchedule()
    assert waits_while_down(fresh, rand, 0.0, fresh.after_failure(0.0, rand), 10.0) == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0]


def test_every_outage_starts_young_however_soon_it_follows_the_last() -> None:
    # kasd away 10 s, back for 20 s, away again — ten times in a row (a crash loop): each drop is a
    # new outage, as kasd was away in between (the dials failed), not taking the slot back and
    # dropping it
    schedule, rand = RedialSchedule(), MaxRandom()
    up_for, now = 3600.0, 0.0
    for _ in range(10):
        first = schedule.after_drop(now, up_for, rand)
        waits = waits_while_down(schedule, rand, now, first, now + 10.0)
        assert waits == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0] and not schedule.flapping
        now += sum(waits)
        schedule.tunnel_up()
        up_for, now = 20.0, now + 20.0


def test_a_kasd_that_keeps_dropping_new_tunnels_is_backed_off_from() -> None:
    # kasd accepts each tunnel and drops it half a second later: three quick redials (as for three
    # outages in a row), then the waits double to the minute, and a stable tunnel resets it all
    schedule, rand = RedialSchedule(), MaxRandom()
    now, waits = 0.0, []
    for up_for in [3600.0] + [0.5] * 9:
        waits.append(schedule.after_drop(now, up_for, rand))
        schedule.tunnel_up()  # the next dial is taken at once
        now += waits[-1] + 0.5
    assert waits == [1.0, 1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert schedule.flapping
    assert schedule.after_failure(now, rand) == 60.0  # kasd now away: still backed off from
    schedule.tunnel_up()
    assert schedule.after_drop(now + 100, 30.0, rand) == 1.0 and not schedule.flapping
    # GOAWAY (kasd draining) is replaced at once — unless the slot is flapping
    schedule.tunnel_up()
    assert schedule.after_drop(now + 200, 30.0, rand, goaway=True) == 0.0
    for _ in range(4):
        schedule.tunnel_up()
        schedule.after_drop(now + 300, 1.0, rand, goaway=True)
    schedule.tunnel_up()
    assert schedule.after_drop(now + 300, 1.0, rand, goaway=True) > 0


def test_a_refused_token_is_no_outage() -> None:
    # kasd is there and says no: retrying every second would not change its mind
    schedule, rand = RedialSchedule(), MaxRandom()
    assert schedule.after_drop(0.0, 3600.0, rand) == 1.0
    assert schedule.after_failure(1.0, rand) == 2.0
    assert [schedule.after_failure(t, rand, refused=True) for t in (3.0, 7.0)] == [4.0, 8.0]
    assert schedule.after_failure(15.0, rand) == 16.0  # the rest of this outage too


def test_full_jitter_spreads_the_redials_over_the_two_seconds() -> None:
    rand = random.Random(7)
    schedule = RedialSchedule()
    waits = [schedule.after_failure(float(t), rand) for t in range(1, 200)][1:59]
    assert all(0 <= w <= 2 for w in waits) and min(waits) < 0.2 and max(waits) > 1.8
    assert len(set(waits)) == len(waits)


class FakeSession:
    def __init__(self) -> None:
        self._ended = trio.Event()
        self.close_reason = None

    @property
    def closed(self) -> bool:
        return self._ended.is_set()

    def hand_streams_to(self, on_stream: Any) -> None:
        pass  # the peer never opens a stream here

    async def wait_goaway(self) -> None:
        await self._ended.wait()

    def statistics(self) -> Any:
        return SimpleNamespace(goaway_received=False)

    async def drain(self, message: str = "") -> None:
        self._ended.set()
        await trio.lowlevel.checkpoint()


class Plan:
    """Dial outcomes in order: "fail", "reject", a number (stay up that many seconds), or "hang"."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.dials: list[tuple[str, float]] = []
        self.exhausted = trio.Event()

    @asynccontextmanager
    async def dial(self, url: str, token: str, metadata: Any) -> AsyncIterator[Any]:
        assert token == "t0ken"
        self.dials.append((url, trio.current_time()))
        step = self.steps.pop(0) if self.steps else "hang"
        if step == "hang":
            self.exhausted.set()
            await trio.sleep_forever()
        if step == "fail":
            raise OSError("connection refused")
        if step == "reject":
            raise TunnelRejectedError(401, "invalid token")
        session = FakeSession()
        async with trio.open_nursery() as nursery:

            async def end_later() -> None:
                await trio.sleep(step)
                session._ended.set()

            nursery.start_soon(end_later)
            yield session
            nursery.cancel_scope.cancel()


async def run_plan(tmp_path: Path, plan: Plan, *, urls: tuple[str, ...] = ("http://a/tunnel",),
                   connections: int = 1, quick_window: float = 60.0) -> tuple[ConnectionManager, MaxRandom, list[float]]:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    rand = MaxRandom()
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await trio.sleep(seconds)

    async def handler(stream: Any) -> None:
        raise AssertionError("no streams expected")

    manager = ConnectionManager(urls, token_file=token, handler=handler, metadata={}, connections=connections,
                                backoff=Backoff(base=1.0, cap=60.0), stable_after=30.0,
                                quick_window=quick_window, rand=rand, sleep=sleep, dial=plan.dial)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await plan.exhausted.wait()
        manager.stop()
    return manager, rand, sleeps


async def test_the_manager_follows_the_schedule(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # kasd away from the start: 1 s, then 2 s for the outage's first minute, then doubling to 60 s
    plan = Plan(*["fail"] * 37)
    manager, rand, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1] + [2] * 30 + [4, 8, 16, 32, 60, 60]
    assert [b for _, b in rand.ranges] == sleeps
    gaps = [b - a for (_, a), (_, b) in zip(plan.dials, plan.dials[1:], strict=False)]
    assert gaps == pytest.approx(sleeps)
    stats = manager.statistics()
    assert stats.dials == 38 and stats.failures == 37 and stats.tunnels_up == 0


async def test_backoff_resets_after_a_stable_tunnel(autojump_clock: trio.testing.MockClock,
                                                    tmp_path: Path) -> None:
    # three failures, a tunnel that stays up 40 s (stable), then failures start from the base again
    # (quick_window 0: plain doubling, no 2 s cap)
    plan = Plan("fail", "fail", "fail", 40.0, "fail", "fail")
    _, _, sleeps = await run_plan(tmp_path, plan, quick_window=0)
    assert sleeps == [1, 2, 4, 1, 2, 4]


async def test_the_quick_window_is_configurable(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # A tunnel up 40 s drops at t=40. For the quick window (9.5 s here) waits are at most 2 s; the
    # dial at t=51 is past it: from there the ceiling doubles (4, 8).
    plan = Plan(40.0, *["fail"] * 7)
    manager, _, sleeps = await run_plan(tmp_path, plan, quick_window=9.5)
    assert sleeps == [1, 2, 2, 2, 2, 2, 4, 8]
    assert [t for _, t in plan.dials][:8] == pytest.approx([0, 41, 43, 45, 47, 49, 51, 55])
    assert manager.statistics().failures == 8  # the drop and seven failed dials


async def test_a_rejected_token_ends_the_quick_schedule(autojump_clock: trio.testing.MockClock,
                                                        tmp_path: Path) -> None:
    # kasd is back and refuses the token: not an outage, so no more redials every second or two
    plan = Plan(40.0, "fail", "reject", "fail")
    _, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 2, 4, 8]


async def test_a_kasd_that_drops_every_new_tunnel_is_backed_off_from(autojump_clock: trio.testing.MockClock,
                                                                      tmp_path: Path) -> None:
    plan = Plan(40.0, *[0.5] * 7)
    _, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 1, 1, 1, 2, 4, 8, 16]


async def test_a_dial_that_hangs_gives_up_after_the_dial_timeout(autojump_clock: trio.testing.MockClock,
                                                                 tmp_path: Path) -> None:
    # kasd's address black-holes the SYN (or never answers the handshake): the slot gives up after
    # dial_timeout and backs off, instead of waiting for the kernel's connect timeout (~2 minutes)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    dials: list[float] = []
    second = trio.Event()

    @asynccontextmanager
    async def dial(url: str, token: str, metadata: Any) -> AsyncIterator[Any]:
        dials.append(trio.current_time())
        if len(dials) == 2:
            second.set()
        await trio.sleep_forever()
        yield  # pragma: no cover

    async def handler(stream: Any) -> None:
        raise AssertionError("no streams expected")

    manager = ConnectionManager(("http://a/tunnel",), token_file=token, handler=handler, metadata={},
                                connections=1, dial_timeout=10.0, rand=MaxRandom(), dial=dial)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await second.wait()
        manager.stop()
    assert dials == pytest.approx([0.0, 11.0])  # 10 s of dial, then 1 s of backoff
    assert manager.statistics().failures == 1


async def test_rejected_token_backs_off_too(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    plan = Plan("reject", "reject", "reject")
    manager, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 2, 4]
    assert manager.statistics().rejected == 3


async def test_round_robin_over_addresses(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    plan = Plan("fail", "fail", "fail", "fail")
    await run_plan(tmp_path, plan, urls=("http://a/tunnel", "http://b/tunnel"))
    assert [url for url, _ in plan.dials] == ["http://a/tunnel", "http://b/tunnel"] * 2 + ["http://a/tunnel"]


class FlakyKasd:
    """kasd away during ``outages`` ((start, end) pairs of seconds): a dial then fails as a closed
    port does, and a tunnel up when an outage starts ends. Records when each agent's tunnels came up."""

    def __init__(self, outages: list[tuple[float, float]]) -> None:
        self.outages = outages
        self.ups: dict[int, list[float]] = {}

    def dialer(self, agent: int) -> Any:
        ups = self.ups.setdefault(agent, [])

        @asynccontextmanager
        async def dial(url: str, token: str, metadata: Any) -> AsyncIterator[Any]:
            now = trio.current_time()
            if any(start <= now < end for start, end in self.outages):
                raise OSError("connection refused")
            ups.append(now)
            session = FakeSession()
            async with trio.open_nursery() as nursery:

                async def end_at_next_outage() -> None:
                    await trio.sleep_until(min((s for s, _ in self.outages if s > now), default=math.inf))
                    session._ended.set()

                nursery.start_soon(end_at_next_outage)
                yield session
                nursery.cancel_scope.cancel()

        return dial


async def test_back_to_back_outages_are_each_reconnected_within_three_seconds(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # kasd away 10 s, back 20 s, away 10 s (the case: 15 s or more late before) — eight
    # times in a row — then away a whole minute, back 15 s, away 10 s. A fleet of 12 agents with
    # real jitter, and one that always waits the longest the jitter allows.
    outages = [(40.0 + 30 * i, 50.0 + 30 * i) for i in range(8)] + [(280.0, 340.0), (355.0, 365.0)]
    kasd = FlakyKasd(outages)
    token = tmp_path / "token"
    token.write_text("t0ken\n")

    async def handler(stream: Any) -> None:
        raise AssertionError("no streams expected")

    rands: list[random.Random] = [random.Random(seed) for seed in range(12)] + [MaxRandom()]
    managers = [ConnectionManager(("http://a/tunnel",), token_file=token, handler=handler, metadata={},
                                  connections=1, rand=rand, dial=kasd.dialer(i)) for i, rand in enumerate(rands)]
    async with trio.open_nursery() as nursery:
        for manager in managers:
            await nursery.start(manager.run)
        await trio.sleep_until(380.0)
        for manager in managers:
            manager.stop()
    delays = {back: [min((t for t in kasd.ups[i] if t >= back), default=math.inf) - back for i in range(len(rands))]
              for _, back in outages}
    latest = {back: round(max(d), 2) for back, d in delays.items()}
    assert all(late <= 2.0 for late in latest.values()), latest  # within 3 s, with a second to spare
    for by_agent in delays.values():  # spread over the window, not in step
        assert max(by_agent[:-1]) - min(by_agent[:-1]) > 1.0
    # between outages each agent dialed about once a second: bounded, not a tight loop
    down = sum(end - start for start, end in outages)
    dials_while_down = sum(m.statistics().dials for m in managers) - sum(len(u) for u in kasd.ups.values())
    assert dials_while_down < len(managers) * down * 1.2
