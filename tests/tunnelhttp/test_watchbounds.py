"""Event boundaries in endless responses, and the drain that ends them there."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tunnelhttp.drain import Drain
from tunnelhttp.watchbounds import EventBoundary, is_endless

pytestmark = pytest.mark.timeout(20)


@pytest.mark.parametrize(("target", "endless"), [
    ("/api/v1/namespaces/default/pods?watch=true", True),
    ("/api/v1/pods?labelSelector=a%3Db&watch=1&resourceVersion=5", True),
    ("/api/v1/namespaces/default/pods/p/log?follow=true&container=c", True),
    ("/api/v1/watch/namespaces/default/pods", True),
    ("/api/v1/pods?watch=false", False),
    ("/api/v1/pods?watch=0", False),
    ("/api/v1/namespaces/default/pods/p/log", False),
    ("/api/v1/namespaces/default/configmaps/watch", False),  # a ConfigMap named "watch"
    ("/api/v1/pods?fieldSelector=metadata.name%3Dwatch", False),
])
def test_endless_requests(target: str, endless: bool) -> None:
    assert is_endless(target) is endless
    assert (EventBoundary.for_response(target, "application/json") is not None) is endless


def _cuts(chunks: list[bytes]) -> list[int]:
    """Feed chunk by chunk; the offsets after which the tracker says a cut splits nothing."""
    boundary = EventBoundary("application/vnd.kubernetes.protobuf;stream=watch")
    offsets, offset = [], 0
    for chunk in chunks:
        boundary.feed(chunk)
        offset += len(chunk)
        if boundary.at_boundary:
            offsets.append(offset)
    return offsets


@given(frames=st.lists(st.binary(max_size=300), max_size=8), data=st.data())
def test_protobuf_frames_split_anywhere(frames: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(struct.pack(">I", len(frame)) + frame for frame in frames)
    frame_ends, offset = set(), 0
    for frame in frames:
        offset += 4 + len(frame)
        frame_ends.add(offset)
    splits = data.draw(st.sets(st.integers(1, max(len(stream) - 1, 1)), max_size=20))
    chunk_ends = sorted({o for o in splits if o < len(stream)} | ({len(stream)} if stream else set()))
    chunks = [stream[a:b] for a, b in zip([0, *chunk_ends], chunk_ends, strict=False)]
    assert _cuts(chunks) == sorted(frame_ends & set(chunk_ends))


def test_json_lines_end_at_newlines() -> None:
    boundary = EventBoundary("application/json")
    assert boundary.at_boundary
    boundary.feed(b'{"type":"ADDED","object":{')
    assert not boundary.at_boundary
    boundary.feed(b'}}\n{"type":')
    assert not boundary.at_boundary
    boundary.feed(b'"MODIFIED"}\n')
    assert boundary.at_boundary


async def test_drain_ends_a_waiting_watch_at_once() -> None:
    send, receive = trio.testing.memory_stream_pair()
    drain = Drain()
    boundary = EventBoundary("application/json")
    await send.send_all(b'{"type":"ADDED"}\n')
    assert await drain.next_chunk(receive.receive_some, boundary) == b'{"type":"ADDED"}\n'
    async with trio.open_nursery() as nursery:
        got: list[bytes | None] = []

        async def next_chunk() -> None:
            got.append(await drain.next_chunk(receive.receive_some, boundary))

        nursery.start_soon(next_chunk)
        await trio.testing.wait_all_tasks_blocked()
        drain.begin()
    assert got == [None]


async def test_drain_lets_the_event_in_passage_finish() -> None:
    send, receive = trio.testing.memory_stream_pair()
    drain = Drain()
    boundary = EventBoundary("application/json")
    await send.send_all(b'{"type":"ADDED","object":')
    assert await drain.next_chunk(receive.receive_some, boundary) == b'{"type":"ADDED","object":'
    drain.begin()
    await send.send_all(b'{}}\n{"type":"DELETED"}\n')
    assert await drain.next_chunk(receive.receive_some, boundary) == b'{}}\n{"type":"DELETED"}\n'
    assert await drain.next_chunk(receive.receive_some, boundary) is None


async def test_drain_leaves_finite_answers_alone() -> None:
    send, receive = trio.testing.memory_stream_pair()
    drain = Drain()
    drain.begin()
    await send.send_all(b"[1, 2,")
    assert await drain.next_chunk(receive.receive_some, None) == b"[1, 2,"
