"""``routing.peers`` alone: the pool's own clocks are its caller's to set. (The hop itself, with
real kasd runtimes on both sides, is tested in tests/kasd/test_replicas.py.)"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from routing.peers import PeerPool, _Peer

pytestmark = pytest.mark.timeout(10)


class _NeverDrains:
    """A departed peer's session whose streams never finish."""

    closed = False
    draining = False

    def __init__(self) -> None:
        self.drains: list[str] = []

    async def drain(self, message: str) -> None:
        self.drains.append(message)
        await trio.sleep_forever()


async def test_the_caller_sets_how_long_a_departed_peer_keeps_its_streams(autojump_clock: trio.testing.MockClock) -> None:
    pool = PeerPool(token="secret-secret-secret", wind_down_timeout=9.0)
    session = _NeverDrains()
    peer = _Peer("b:1", "http://127.0.0.1:1", session=session)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        pool._peers["b:1"] = peer
        started = trio.current_time()
        with peer.scope:  # what ``_keep`` holds the session under
            pool.forget("b:1")
            await trio.sleep_forever()
        assert trio.current_time() - started == pytest.approx(9.0)
        assert session.drains == ["member left"] and "b:1" not in pool.known()
        nursery.cancel_scope.cancel()

