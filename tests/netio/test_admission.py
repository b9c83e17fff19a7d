"""netio.admission: the per-listener connection caps, on real loopback sockets."""

from __future__ import annotations

import pytest
import trio

from netio.admission import PER_SOURCE, TOTAL, Admission, ConnectionCaps, Refusal, source_of

pytestmark = pytest.mark.timeout(10)


def test_a_source_is_an_ipv4_address_or_an_ipv6_slash_64() -> None:
    assert source_of("192.0.2.7") == "192.0.2.7"
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert source_of("fe80::1%eth0") == "fe80::/64"


def test_the_table_holds_only_sources_with_open_connections() -> None:
    admission = Admission(ConnectionCaps(max_connections=3, max_per_source=2))
    assert admission.admit("a") is None
    assert admission.admit("a") is None
    assert admission.admit("a") == PER_SOURCE
    assert admission.admit("b") is None
    assert admission.admit("c") == TOTAL
    admission.release("a")
    admission.release("a")
    admission.release("b")
    stats = admission.statistics()
    assert (stats.connections, stats.sources) == (0, 0)


async def _listen(admission: Admission) -> tuple[trio.abc.Listener[trio.abc.Stream], int]:
    [inner] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    return admission.listener(inner), inner.socket.getsockname()[1]


async def test_a_refused_connection_is_reset_unread_and_reported() -> None:
    refusals: list[Refusal] = []
    admission = Admission(ConnectionCaps(max_connections=1, max_per_source=1), on_refused=refusals.append)
    listener, port = await _listen(admission)
    async with listener:
        first = await trio.open_tcp_stream("127.0.0.1", port)
        served = await listener.accept()
        second = await trio.open_tcp_stream("127.0.0.1", port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.accept)  # refuses the second, takes the third
            with trio.fail_after(5):
                with pytest.raises(trio.BrokenResourceError):  # a reset, not an orderly close
                    await second.receive_some(1)
            assert [(r.reason, r.source, r.limit) for r in refusals] == [(TOTAL, "127.0.0.1", 1)]
            assert admission.statistics().refused == 1
            await served.aclose()
            await first.aclose()
            third = await trio.open_tcp_stream("127.0.0.1", port)
        assert admission.statistics().connections == 1
        await third.aclose()


async def test_a_slot_is_freed_even_when_closing_is_cancelled() -> None:
    admission = Admission(ConnectionCaps(max_connections=1, max_per_source=1))
    listener, port = await _listen(admission)
    async with listener:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        served = await listener.accept()
        assert admission.statistics().connections == 1
        with trio.CancelScope() as scope:
            scope.cancel()
            await served.aclose()
        await served.aclose()  # a second close frees nothing more
        assert admission.statistics().connections == 0
        await client.aclose()
