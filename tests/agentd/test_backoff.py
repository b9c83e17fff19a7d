"""The connection manager's dialing: full-jitter exponential backoff, its reset after a stable
tunnel, round-robin over addresses — under ``autojump_clock`` with a fake dialer."""

from __future__ import annotations

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


def test_full_jitter_bounds() -> None:
    backoff = Backoff(base=1.0, cap=60.0)
    rand = MaxRandom()
    assert [backoff.delay(n, rand) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    seeded = random.Random(7)
    values = [backoff.delay(5, seeded) for _ in range(200)]
    assert all(0 <= v <= 16 for v in values)
    assert min(values) < 2 and max(values) > 14  # the whole range, not a narrow band


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
                   connections: int = 1, quick_window: float = 30.0) -> tuple[ConnectionManager, MaxRandom, list[float]]:
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


async def test_failures_back_off_exponentially_with_jitter(autojump_clock: trio.testing.MockClock,
                                                           tmp_path: Path) -> None:
    plan = Plan(*["fail"] * 8)
    manager, rand, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 2, 4, 8, 16, 32, 60, 60]
    assert [b for _, b in rand.ranges] == sleeps
    gaps = [b - a for (_, a), (_, b) in zip(plan.dials, plan.dials[1:], strict=False)]
    assert gaps == pytest.approx(sleeps)
    stats = manager.statistics()
    assert stats.dials == 9 and stats.failures == 8 and stats.tunnels_up == 0


async def test_backoff_resets_after_a_stable_tunnel(autojump_clock: trio.testing.MockClock,
                                                    tmp_path: Path) -> None:
    # three failures, a tunnel that stays up 40 s (stable), then failures start from the base again
    # (no quick window here: the reset alone; the next tests show the quick redials on top of it)
    plan = Plan("fail", "fail", "fail", 40.0, "fail", "fail")
    _, _, sleeps = await run_plan(tmp_path, plan, quick_window=0)
    assert sleeps == [1, 2, 4, 1, 2, 4]


async def test_a_short_outage_after_a_stable_tunnel_is_redialed_every_second(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # A tunnel up 40 s drops at t=40 (kasd restarting). For the quick window (9.5 s here) every redial
    # waits uniform(0.5, 1): MaxRandom takes the top, 1 s. The dial at t=50 is past the window: from
    # there the count grows as before (2, 4, 8), so a long outage is backed off from.
    plan = Plan(40.0, *["fail"] * 12)
    manager, rand, sleeps = await run_plan(tmp_path, plan, quick_window=9.5)
    assert sleeps == [1] * 10 + [2, 4, 8]
    assert rand.ranges == [(0.5, 1.0)] * 10 + [(0.0, 2.0), (0.0, 4.0), (0.0, 8.0)]
    dial_times = [t for _, t in plan.dials]
    assert dial_times[:12] == pytest.approx([0, *range(41, 51), 52])
    assert manager.statistics().failures == 13  # the drop and twelve failed dials


async def test_quick_redials_spread_over_half_a_second(autojump_clock: trio.testing.MockClock,
                                                       tmp_path: Path) -> None:
    # With a real random source: every quick redial waits between 0.5 s and 1 s, and they differ, so
    # agents whose tunnels dropped together do not dial in step.
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    plan = Plan(40.0, *["fail"] * 20)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await trio.sleep(seconds)

    async def handler(stream: Any) -> None:
        raise AssertionError("no streams expected")

    manager = ConnectionManager(("http://a/tunnel",), token_file=token, handler=handler, metadata={},
                                connections=1, rand=random.Random(3), sleep=sleep, dial=plan.dial)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await plan.exhausted.wait()
        manager.stop()
    assert len(sleeps) == 21  # all within the default 30 s window
    assert all(0.5 <= s <= 1.0 for s in sleeps)
    assert max(sleeps) - min(sleeps) > 0.3 and len(set(sleeps)) == len(sleeps)


async def test_a_rejected_token_ends_the_quick_window(autojump_clock: trio.testing.MockClock,
                                                      tmp_path: Path) -> None:
    # kasd is back and refuses the token: not an outage, so no more redials every second
    plan = Plan(40.0, "fail", "reject", "fail")
    _, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 1, 2, 4]


async def test_a_tunnel_that_drops_soon_after_connecting_ends_the_quick_window(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # kasd came back but drops the agent after 5 s: that is a kasd to back off from, not an outage
    plan = Plan(40.0, "fail", 5.0, "fail", "fail")
    _, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 1, 2, 4, 8]


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


async def test_short_lived_tunnels_keep_backing_off(autojump_clock: trio.testing.MockClock,
                                                    tmp_path: Path) -> None:
    # a tunnel that drops after 5 s is no proof of health: the count keeps growing
    plan = Plan("fail", "fail", "fail", 5.0, "fail")
    _, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 2, 4, 8, 16]


async def test_rejected_token_backs_off_too(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    plan = Plan("reject", "reject", "reject")
    manager, _, sleeps = await run_plan(tmp_path, plan)
    assert sleeps == [1, 2, 4]
    assert manager.statistics().rejected == 3


async def test_round_robin_over_addresses(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    plan = Plan("fail", "fail", "fail", "fail")
    await run_plan(tmp_path, plan, urls=("http://a/tunnel", "http://b/tunnel"))
    assert [url for url, _ in plan.dials] == ["http://a/tunnel", "http://b/tunnel"] * 2 + ["http://a/tunnel"]
