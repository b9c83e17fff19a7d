"""The drain's deadlines are its caller's (``kasd.drain.DrainDeadlines``, set by ``serve_kasd`` from
``shutdown_timeout`` and ``routing.leave_timeout``): a replica whose Redis hangs at shutdown leaves
once they run out, not at a bound fixed inside the drain. Fakes and trio's autojump clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from kasd.drain import DrainDeadlines, drain_alone, drain_replica

pytestmark = pytest.mark.timeout(10)


class _Proxy:
    connections = 0

    def __init__(self, closes_after: float = 0.0) -> None:
        self.closes_after = closes_after
        self.draining = False

    def start_drain(self) -> None:
        self.draining = True

    async def wait_closed(self) -> None:
        await trio.sleep(self.closes_after)


class _Registry:
    def tunnels(self) -> list[Any]:
        return []


class _HangingRedis:
    """A membership and a directory whose every Redis step never answers."""

    def __init__(self) -> None:
        self.membership = self
        self.directory = self
        self.steps: list[str] = []

    async def _hang(self, step: str) -> None:
        self.steps.append(step)
        await trio.sleep_forever()

    async def set_draining(self) -> None:
        await self._hang("set_draining")

    async def withdraw(self) -> None:
        await self._hang("withdraw")

    async def leave(self) -> None:
        await self._hang("leave")


class _Forwarder:
    active = 0

    async def drain_sessions(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_replica_whose_redis_hangs_leaves_within_its_leave_timeout(autojump_clock: trio.testing.MockClock) -> None:
    redis = _HangingRedis()
    start = trio.current_time()
    await drain_replica(_Proxy(), _Registry(), DrainDeadlines(total=20.0, redis=0.5),  # type: ignore[arg-type]
                        replicas=redis, forwarder=_Forwarder(), placement=None)  # type: ignore[arg-type]
    # marking itself draining: 0.5 s; nothing to drain; withdrawing (and so never leaving): 0.5 s
    assert trio.current_time() - start == pytest.approx(1.0)
    assert redis.steps == ["set_draining", "withdraw"]


async def test_marking_a_replica_draining_takes_at_most_a_quarter_of_the_drain(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    await drain_replica(_Proxy(), _Registry(), DrainDeadlines(total=1.0, redis=30.0),  # type: ignore[arg-type]
                        replicas=_HangingRedis(), forwarder=_Forwarder(), placement=None)  # type: ignore[arg-type]
    assert trio.current_time() - start == pytest.approx(0.25 + 30.0)


async def test_a_lone_drain_ends_at_its_total(autojump_clock: trio.testing.MockClock) -> None:
    proxy = _Proxy(closes_after=100.0)
    start = trio.current_time()
    await drain_alone(proxy, _Registry(), DrainDeadlines(total=3.0))  # type: ignore[arg-type]
    assert proxy.draining and trio.current_time() - start == pytest.approx(3.0)
