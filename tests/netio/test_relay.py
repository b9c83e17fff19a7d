"""The byte relay after 101, over in-memory streams: half-closes, early bytes, counters, and which
side broke first."""

from __future__ import annotations

import trio
import trio.testing

from netio.relay import relay


class WholeStream(trio.abc.Stream):
    """A stream that cannot half-close (as TLS cannot), over one end of a memory stream pair."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Breakable(trio.abc.HalfCloseableStream):
    """A half-closeable memory stream end whose next receive fails once ``broken`` is set."""

    def __init__(self, inner: trio.StapledStream[trio.abc.SendStream, trio.abc.ReceiveStream]) -> None:
        self.inner = inner
        self.broken = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        async with trio.open_nursery() as nursery:
            result: list[bytes | bytearray] = []

            async def receive() -> None:
                result.append(await self.inner.receive_some(max_bytes))
                nursery.cancel_scope.cancel()

            async def fail() -> None:
                await self.broken.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(receive)
            nursery.start_soon(fail)
        if not result:
            raise trio.BrokenResourceError("the peer went away")
        return result[0]

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _read_all(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


async def test_both_ways_with_early_bytes_and_half_closes() -> None:
    client_far, client = trio.testing.memory_stream_pair()
    server, server_far = trio.testing.memory_stream_pair()
    counted: list[tuple[str, int]] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                results.append(
                    await relay(
                        client,
                        server,
                        early_to_server=b"early-up ",
                        early_to_client=b"early-down ",
                        on_to_server=lambda n: counted.append(("up", n)),
                        on_to_client=lambda n: counted.append(("down", n)),
                    )
                )

            nursery.start_soon(run)
            await client_far.send_all(b"stdin")
            await client_far.send_eof()  # passed on: the server sees the end of its input
            assert await _read_all(server_far) == b"early-up stdin"
            await server_far.send_all(b"stdout")
            await server_far.send_eof()
            assert await _read_all(client_far) == b"early-down stdout"
    (result,) = results
    assert (result.to_server, result.to_client) == (14, 17)
    assert result.broken is None and result.server_finished
    assert sum(n for d, n in counted if d == "up") == 14 and sum(n for d, n in counted if d == "down") == 17


async def test_the_servers_end_ends_a_relay_whose_client_cannot_half_close() -> None:
    client_far, client_end = trio.testing.memory_stream_pair()
    server, server_far = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                results.append(await relay(WholeStream(client_end), server))

            nursery.start_soon(run)
            await server_far.send_all(b"bye")
            await server_far.send_eof()
            assert await client_far.receive_some() == b"bye"
            await trio.testing.wait_all_tasks_blocked()
        # the client never ended its side: the relay ended with the server's
    assert results[0].server_finished and results[0].broken is None


async def test_the_clients_end_gives_a_server_that_cannot_half_close_the_grace_to_answer(
        autojump_clock: trio.testing.MockClock) -> None:
    client_far, client = trio.testing.memory_stream_pair()
    server_end, server_far = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                results.append(await relay(client, WholeStream(server_end), client_end_grace=2.0))

            nursery.start_soon(run)
            await client_far.send_eof()
            await trio.sleep(1.9)  # (virtual time) within the grace: still listening to the server
            assert not results
            await server_far.send_all(b"late answer")
            await server_far.send_eof()
            assert await _read_all(client_far) == b"late answer"
    assert results[0].server_finished and not results[0].cut


async def test_a_client_that_went_away_is_not_waited_for_past_the_grace(autojump_clock: trio.testing.MockClock) -> None:
    """The client's end (a FIN, a proxy's TLS close_notify) is passed on as a half-close or, where
    the server cannot take one, not at all: either way a server that does not finish is cut off
    after the grace, so nothing the client held stays open."""
    for whole in (False, True):
        client_far, client = trio.testing.memory_stream_pair()
        server_end, server_far = trio.testing.memory_stream_pair()
        server: trio.abc.Stream = WholeStream(server_end) if whole else server_end
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                results = []

                async def run() -> None:
                    results.append(await relay(client, server, client_end_grace=2.0))  # noqa: B023

                nursery.start_soon(run)
                await client_far.send_all(b"stdin")
                await client_far.send_eof()
                if not whole:
                    assert await _read_all(server_far) == b"stdin"  # the half-close went on
                started = trio.current_time()
        (result,) = results
        assert result.cut and result.broken is None and not result.server_finished
        assert trio.current_time() - started == 2.0


async def test_what_the_server_sent_reaches_the_client_although_sending_to_it_failed() -> None:
    """A far end that sent its last bytes (a WebSocket close frame) and stopped listening: a
    failed send towards it does not cut those bytes off on their way to the client."""
    client_far, client = trio.testing.memory_stream_pair()
    server_inner, server_far = trio.testing.memory_stream_pair()
    read_on = trio.Event()

    class StopsListening(Breakable):
        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            raise trio.BrokenResourceError("the far end stopped listening")

        async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
            await read_on.wait()  # the close frame is still on its way when the send fails
            return await self.inner.receive_some(max_bytes)

    server = StopsListening(server_inner)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                results.append(await relay(client, server))
                await client.aclose()

            nursery.start_soon(run)
            await server_far.send_all(b"\x88\x02\x03\xe8")  # close 1000
            await server_far.send_eof()
            await client_far.send_all(b"late keystroke")  # meets the far end that stopped listening
            await trio.testing.wait_all_tasks_blocked()
            read_on.set()
            assert await _read_all(client_far) == b"\x88\x02\x03\xe8"
    assert results[0].broken == "server" and results[0].to_client == 4


async def test_a_client_that_breaks_mid_pipe_is_named() -> None:
    client_far, client_inner = trio.testing.memory_stream_pair()
    client = Breakable(client_inner)
    server, server_far = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                results.append(await relay(client, server))

            nursery.start_soon(run)
            await server_far.send_all(b"still talking")
            assert await client_far.receive_some() == b"still talking"
            client.broken.set()
    assert results[0].broken == "client" and not results[0].server_finished


async def test_a_break_after_the_server_finished_is_the_pipe_winding_down() -> None:
    client_far, client_inner = trio.testing.memory_stream_pair()
    client = Breakable(client_inner)
    server, server_far = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                results.append(await relay(client, server))

            nursery.start_soon(run)
            await server_far.send_eof()  # the exec ended
            assert await client_far.receive_some() == b""
            client.broken.set()  # then the client hangs up
    assert results[0].broken == "client" and results[0].server_finished


async def test_a_server_that_breaks_is_named_unless_its_errors_are_its_end() -> None:
    for errors_are_eof in (False, True):
        client_far, client = trio.testing.memory_stream_pair()
        server_end, _server_far = trio.testing.memory_stream_pair()
        server = Breakable(server_end)
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                results = []

                async def run() -> None:
                    results.append(await relay(client, server, server_receive_error_is_eof=errors_are_eof))  # noqa: B023

                nursery.start_soon(run)
                await trio.testing.wait_all_tasks_blocked()
                server.broken.set()
                if errors_are_eof:
                    assert await client_far.receive_some() == b""  # told as an end
                    await client_far.send_eof()
        if errors_are_eof:
            assert results[0].broken is None and results[0].server_finished
        else:
            assert results[0].broken == "server" and not results[0].server_finished
