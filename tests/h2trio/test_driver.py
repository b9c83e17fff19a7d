"""The h2-over-Trio driver over in-memory streams: a server front end's use (many request streams,
each with a head, a body and an answer) against a plain h2 client, and a driver on both ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
import trio
import trio.testing

from h2trio.budget import DEFAULT_RESET_LIMIT, BudgetExceededError, ResetLimit
from h2trio.driver import H2Driver, H2Stream
from h2trio.lean import new_connection


def _server_driver(
    stream: trio.abc.Stream, *, window: int = 65535, reset_limit: ResetLimit = DEFAULT_RESET_LIMIT
) -> H2Driver:
    conn = new_connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    return H2Driver(
        stream, conn, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}, reset_limit=reset_limit
    )


class Client:
    """A plain h2 client over one end of a memory stream pair, driven by hand."""

    def __init__(self, stream: trio.abc.Stream, *, window: int = 65535) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.events: list[h2.events.Event] = []

    async def flush(self) -> None:
        if data := self.conn.data_to_send():
            await self.stream.send_all(data)

    async def read(self) -> list[h2.events.Event]:
        data = await self.stream.receive_some()
        events = self.conn.receive_data(data)
        self.events.extend(events)
        await self.flush()
        return events

    async def request(self, path: str, body: bytes = b"", *, end: bool = True) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", path)]
        self.conn.send_headers(stream_id, headers, end_stream=end and not body)
        if body:
            self.conn.send_data(stream_id, body, end_stream=end)
        await self.flush()
        return stream_id

    async def response(self, stream_id: int) -> tuple[dict[str, str], bytes]:
        """Read until ``stream_id`` ended; acknowledge its data as it comes."""
        head: dict[str, str] = {}
        body = b""
        done = False
        seen = 0
        while not done:
            if seen == len(self.events):
                await self.read()
            for event in self.events[seen:]:
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    head = dict(event.headers)  # type: ignore[arg-type]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data  # type: ignore[operator]
                    self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)  # type: ignore[arg-type]
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    done = True
            seen = len(self.events)
            await self.flush()
        return head, body


async def _echo_upper(h2s: H2Stream) -> None:
    body = b""
    while data := await h2s.receive_data():
        body += data
    head = dict(h2s.head or ())
    await h2s.send_headers([(":status", "200"), ("x-path", head[":path"])])
    await h2s.send_data(body.upper(), end_stream=True)
    h2s.close()


async def test_server_front_end_answers_concurrent_requests() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end)
    client = Client(client_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            driver.on_request = lambda h2s: nursery.start_soon(_echo_upper, h2s)
            nursery.start_soon(driver.run_reader)
            await client.flush()
            ids = [await client.request(f"/r{i}", b"body %d " % i * 2000) for i in range(3)]
            for i, stream_id in enumerate(ids):
                head, body = await client.response(stream_id)
                assert head[":status"] == "200" and head["x-path"] == f"/r{i}"
                assert body == (b"body %d " % i * 2000).upper()
            assert driver.streams == {}
            client.conn.close_connection()
            await client.flush()
        assert driver.closed and "GOAWAY" in driver.close_reason


@asynccontextmanager
async def _a_held_upload(window: int) -> AsyncIterator[tuple[Client, int, H2Stream, H2Driver]]:
    """A server driver announcing ``window``, and a client whose request sent one frame of
    ``window`` bytes that no handler has taken yet: (client, its stream id, the server's stream, the
    driver)."""
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end, window=window)
    client = Client(client_end)
    taken: list[H2Stream] = []
    driver.on_request = taken.append
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client.flush()
            while client.conn.remote_settings.initial_window_size != window:
                await client.read()
            stream_id = await client.request("/upload", end=False)
            client.conn.send_data(stream_id, b"x" * window)  # one frame
            await client.flush()
            await trio.testing.wait_all_tasks_blocked()
            (h2s,) = taken
            yield client, stream_id, h2s, driver
            nursery.cancel_scope.cancel()


async def test_body_is_acknowledged_only_as_the_handler_takes_it() -> None:
    # Flow control is the backpressure: a handler that does not read holds the client at its window.
    async with _a_held_upload(1000) as (client, stream_id, h2s, _):
        assert client.conn.local_flow_control_window(stream_id) == 0
        assert await h2s.receive_data() == b"x" * 1000  # taking it opens the window again
        while client.conn.local_flow_control_window(stream_id) == 0:
            await client.read()
        assert client.conn.local_flow_control_window(stream_id) == 1000


async def test_a_body_taken_in_parts_smaller_than_its_frame_is_acknowledged_part_by_part() -> None:
    # (the tunnel's session takes at most 256 KiB at a time, the peer's frames are up to 1 MiB)
    async with _a_held_upload(1000) as (_, stream_id, h2s, driver):
        assert await h2s.receive_data(100) == b"x" * 100
        # the 900 bytes still held are still owed: the peer may not send more on their account
        assert h2s.buffered_bytes == 900 and driver.conn.remote_flow_control_window(stream_id) == 0
        assert await h2s.receive_data() == b"x" * 900
        assert h2s.buffered_bytes == 0 and driver.conn.remote_flow_control_window(stream_id) == 1000


async def test_send_data_waits_for_the_clients_window() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end)
    client = Client(client_end, window=100)
    sent = trio.Event()

    async def answer(h2s: H2Stream) -> None:
        await h2s.send_headers([(":status", "200")])
        await h2s.send_data(b"y" * 250, end_stream=True)
        sent.set()

    driver.on_request = lambda h2s: nursery.start_soon(answer, h2s)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client.flush()
            stream_id = await client.request("/download")
            sizes: list[int] = []
            while len(sizes) < 1 or sum(sizes) < 100:
                for event in await client.read():
                    if isinstance(event, h2.events.DataReceived):
                        sizes.append(len(event.data))  # type: ignore[arg-type]
            await trio.testing.wait_all_tasks_blocked()
            assert sum(sizes) == 100 and not sent.is_set()  # parked on the window, not buffered past it
            _, body = await client.response(stream_id)  # acknowledging opens the window
            assert body == b"y" * 250 and sent.is_set()
            nursery.cancel_scope.cancel()


async def test_client_reset_cancels_the_handler_and_fails_its_stream() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end)
    client = Client(client_end)
    outcome: list[Any] = []

    async def slow(h2s: H2Stream) -> None:
        with trio.CancelScope() as scope:
            h2s.cancel_when_broken(scope)
            await trio.sleep_forever()
        outcome.append(scope.cancelled_caught)
        with pytest.raises(trio.BrokenResourceError, match="reset by peer"):
            await h2s.receive_data()
        outcome.append(h2s.reset_code)

    driver.on_request = lambda h2s: nursery.start_soon(slow, h2s)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client.flush()
            stream_id = await client.request("/watch", b"x")
            await trio.testing.wait_all_tasks_blocked()
            client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            await client.flush()
            while len(outcome) < 2:
                await trio.testing.wait_all_tasks_blocked()
                if len(outcome) < 2:
                    await client.read()
            nursery.cancel_scope.cancel()
    assert outcome == [True, h2.errors.ErrorCodes.CANCEL]


async def test_refuses_requests_without_a_handler() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end)
    client = Client(client_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client.flush()
            stream_id = await client.request("/x")
            while not any(isinstance(e, h2.events.StreamReset) for e in client.events):
                await client.read()
            (reset,) = [e for e in client.events if isinstance(e, h2.events.StreamReset)]
            assert (reset.stream_id, reset.error_code) == (stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            nursery.cancel_scope.cancel()


async def test_settings_ack_and_a_large_frame_in_one_read() -> None:
    # A peer may send frames up to our announced MAX_FRAME_SIZE right after acknowledging it; h2
    # alone rejects such a frame when it arrives in the same read as the ACK.
    client_end, server_end = trio.testing.memory_stream_pair()
    conn = new_connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    driver = H2Driver(server_end, conn, settings={h2.settings.SettingCodes.MAX_FRAME_SIZE: 1 << 20})
    taken: list[H2Stream] = []
    driver.on_request = taken.append
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client_end.send_all(client.data_to_send())
            client.receive_data(await client_end.receive_some())  # the server's SETTINGS: an ACK is queued
            assert client.max_outbound_frame_size == 1 << 20
            client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/")])
            client.send_data(1, b"z" * 60000, end_stream=True)  # one 60 KB frame, right behind the ACK
            await client_end.send_all(client.data_to_send())
            while not taken:
                await trio.testing.wait_all_tasks_blocked()
                assert not driver.closed, driver.close_reason
            body = b""
            while data := await taken[0].receive_data():
                body += data
            assert body == b"z" * 60000
            nursery.cancel_scope.cancel()


async def test_a_driver_on_both_ends() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    server = _server_driver(server_end)
    conn = new_connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client = H2Driver(client_end, conn)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server.on_request = lambda h2s: nursery.start_soon(_echo_upper, h2s)
            nursery.start_soon(server.run_reader)
            nursery.start_soon(client.run_reader)
            h2s = await client.open_stream(
                [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/both")]
            )
            await h2s.send_data(b"hello " * 30000, end_stream=True)  # beyond the default windows
            head = dict(await h2s.receive_head())
            body = b""
            while data := await h2s.receive_data():
                body += data
            assert head[":status"] == "200" and body == b"HELLO " * 30000
            # both have seen every SETTINGS of theirs acknowledged: reads go to h2 whole again
            assert client._settings_unacknowledged == server._settings_unacknowledged == 0
            await client.aclose()
        assert server.closed and client.closed


async def test_a_connection_with_no_reader_task_is_read_by_whoever_waits_on_it() -> None:
    """The tunnel's way (no ``run_reader``): a send that waits for the peer's window reads the
    connection itself (the WINDOW_UPDATE that opens it must be read, though nobody receives), and
    a consumer and a sender waiting at once take turns to read, each woken by what the other read."""
    client_end, server_end = trio.testing.memory_stream_pair()
    server = _server_driver(server_end)
    conn = new_connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client = H2Driver(client_end, conn)
    client.reads_on_demand = True
    head = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/none")]

    async def body_of(h2s: H2Stream, into: list[bytes]) -> None:
        while data := await h2s.read_data():
            into.append(data)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server.on_request = lambda h2s: nursery.start_soon(_echo_upper, h2s)
            nursery.start_soon(server.run_reader)
            # alone: nothing reads the client's connection but the sender, beyond 65,535 bytes
            h2s = await client.open_stream(head)
            await h2s.send_data(b"hello " * 30000, end_stream=True)
            first: list[bytes] = []
            await body_of(h2s, first)
            assert b"".join(first) == b"HELLO " * 30000
            # together: a consumer waiting on one stream while another's send waits for its window
            waiting = await client.open_stream(head)
            second: list[bytes] = []
            nursery.start_soon(body_of, waiting, second)
            h2s = await client.open_stream(head)
            await h2s.send_data(b"again " * 30000, end_stream=True)
            await waiting.end_stream()
            third: list[bytes] = []
            await body_of(h2s, third)
            assert b"".join(third) == b"AGAIN " * 30000
            await client.aclose()
        assert second == [] and client.closed


# --------------------------------------------------------------------------- what a peer may cost


def _goaway(client: Client) -> h2.events.ConnectionTerminated | None:
    return next((e for e in client.events if isinstance(e, h2.events.ConnectionTerminated)), None)


async def _read_until_goaway(client: Client) -> h2.events.ConnectionTerminated:
    while (goaway := _goaway(client)) is None:
        try:
            await client.read()
        except h2.exceptions.ProtocolError:
            pass  # the client's h2 objects to what follows a GOAWAY: not what is tested
    return goaway


async def test_streams_reset_in_the_read_that_opened_them_start_nothing() -> None:
    """HTTP/2 rapid reset: HEADERS + RST_STREAM pairs. None is handed to on_request; each spends
    the reset budget, and once it is empty the driver sends GOAWAY ENHANCE_YOUR_CALM."""
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end, reset_limit=ResetLimit(budget=10, window=60.0))
    started: list[H2Stream] = []
    driver.on_request = started.append
    client = Client(client_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            for _ in range(15):
                stream_id = client.conn.get_next_available_stream_id()
                client.conn.send_headers(stream_id, [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/")], end_stream=True)
                client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            await client.flush()  # one write: the driver reads it at once
            goaway = await _read_until_goaway(client)
            nursery.cancel_scope.cancel()
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert goaway.additional_data == b"more than 10 streams reset before their response or refused in 60s"
    assert started == []
    assert driver.closed and driver.statistics().streams_dropped == 11
    assert isinstance(driver.protocol_error, BudgetExceededError)


async def test_resets_before_the_answer_count_and_resets_after_it_do_not() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end, reset_limit=ResetLimit(budget=2, window=60.0))
    started: list[H2Stream] = []
    driver.on_request = started.append
    client = Client(client_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client.flush()
            # Answered, then reset (kubectl ending a watch): free, however many.
            for _ in range(5):
                stream_id = await client.request("/watch")
                while len(started) < 1:
                    await trio.testing.wait_all_tasks_blocked()
                await started.pop().send_headers([(":status", "200")])
                client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                await client.flush()
                await trio.testing.wait_all_tasks_blocked()
            assert not driver.closed and driver.statistics().streams_reset_unanswered == 0
            # Handed over, reset before any answer: each costs a token.
            for _ in range(3):
                stream_id = await client.request("/slow")
                while len(started) < 1:
                    await trio.testing.wait_all_tasks_blocked()
                started.pop()
                client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                await client.flush()
                await trio.testing.wait_all_tasks_blocked()
            goaway = await _read_until_goaway(client)
            nursery.cancel_scope.cancel()
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert driver.statistics().streams_reset_unanswered == 3


async def test_refused_streams_spend_the_reset_budget() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end, reset_limit=ResetLimit(budget=3, window=60.0))
    client = Client(client_end)  # on_request is None: every stream is refused
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            for i in range(5):
                await client.request(f"/{i}")
            goaway = await _read_until_goaway(client)
            nursery.cancel_scope.cancel()
    refused = [e for e in client.events if isinstance(e, h2.events.StreamReset)]
    assert [e.error_code for e in refused] == [h2.errors.ErrorCodes.REFUSED_STREAM] * 4
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert driver.statistics().streams_refused == 4


async def test_an_oversize_frame_header_ends_the_connection_before_its_body() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end)
    client = Client(client_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            await client.request("/upload", end=False)
            await client_end.send_all(b"\x01\x00\x00\x00\x00\x00\x00\x00\x01")  # DATA of 64 KiB, no body
            goaway = await _read_until_goaway(client)
            nursery.cancel_scope.cancel()
    assert goaway.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
    assert driver.closed and isinstance(driver.protocol_error, BudgetExceededError)


async def test_a_reset_stream_gives_its_unread_bytes_back_to_the_connection_window() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    driver = _server_driver(server_end)
    client = Client(client_end)
    started: list[H2Stream] = []
    driver.on_request = started.append
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.run_reader)
            for _ in range(3):  # h2 sends a WINDOW_UPDATE once half the window is given back
                stream_id = await client.request("/upload", b"u" * 16000, end=False)
                client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)  # the handler never read it
                await client.flush()
            assert client.conn.outbound_flow_control_window == 65535 - 48000
            while client.conn.outbound_flow_control_window < 65535:
                await client.read()
            nursery.cancel_scope.cancel()


async def test_a_flush_cancelled_between_two_writes_leaves_the_rest_queued_for_aclose() -> None:
    """The bytes another task queued behind a write in progress are not dropped when the task that
    writes them is cancelled (a daemon shutting down): the connection's close still sends them."""
    written: list[bytes] = []
    hold = trio.Event()

    class SlowStream(trio.abc.Stream):
        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            await trio.lowlevel.checkpoint_if_cancelled()
            with trio.CancelScope(shield=True):
                await hold.wait()
            written.append(bytes(data))

        async def wait_send_all_might_not_block(self) -> None:
            await trio.lowlevel.checkpoint()

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            await trio.sleep_forever()
            return b""  # pragma: no cover

        async def aclose(self) -> None:
            await trio.lowlevel.checkpoint()

    driver = _server_driver(SlowStream())
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def write_first() -> None:
                with first:
                    await driver.flush()  # the preface: its write waits on the stream

            nursery.start_soon(write_first)
            await trio.testing.wait_all_tasks_blocked()
            driver.conn.ping(b"lastbyte")
            await driver.flush()  # queued behind the write in progress
            first.cancel()
            hold.set()
        await driver.aclose()
    assert b"lastbyte" in b"".join(written)
