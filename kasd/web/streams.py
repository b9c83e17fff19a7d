"""Answers that go on: the live graph as server-sent events and a pod's log as chunked text. Each
is an ASGI response that runs its producer beside a watch for the client leaving
(``http.disconnect``): whichever ends first ends the answer, and the watch or the log stream under
it is closed (so the view's last viewer leaving closes the shared watches).

A client that takes nothing (its socket full, it never reads) is dropped once one write has waited
``WRITE_TIMEOUT_SECONDS``: the answer is cut, the connection closed, the view left — never held
open for it. Viewers of one live view (one environment, one viewer identity) share the graph of
each state (``SharedGraphs``): it is built and serialized once, not once per viewer."""

from __future__ import annotations

import json
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, Generic, TypeVar

import trio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from daemonkit.logs import UnexpectedErrors
from kasd.envgraph import node_id
from kasd.web.seams import SnapshotLike, UpdateLike
from kasd.web.shapes import kasd_problem

S = TypeVar("S")

#: a stream ended by an error nobody foresaw: one rate-limited line (type and frames, never the
#: message), and the client is told only that kasd logged it
_UNEXPECTED = UnexpectedErrors(logging.getLogger("kasd.api"))


def ended_because(exc: Exception, shown: tuple[type[Exception], ...]) -> str:
    """What a client of a stream is told about the error that ended it: an error made to be shown
    (``shown``: the view dropping a slow viewer, the agent or the cluster refusing) says its message;
    anything else (a bug) is logged, and its text, which could quote anything, is not sent."""
    if isinstance(exc, shown):
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    _UNEXPECTED.report(exc, "a live stream failed")
    return "kasd could not go on with this stream (it logged why)"

#: seconds between ``: ping`` comments when nothing changes (proxies close quiet connections)
HEARTBEAT_SECONDS = 15.0
#: seconds updates are gathered before one ``graph`` event is sent for them all
COALESCE_SECONDS = 0.2
#: seconds one write to a streamed answer may wait for the client to take it; past that the client
#: is dropped (a viewer that never reads holds neither the view nor the connection)
WRITE_TIMEOUT_SECONDS = 30.0


Write = Callable[[bytes], Awaitable[None]]


class _Producer(Response, Generic[S]):
    """A streamed answer: ``source()`` is entered first (a refusal then is still a whole error
    answer), then ``produce(source, write)`` writes the body; it is cancelled when the client goes."""

    def __init__(self, source: Callable[[], AbstractAsyncContextManager[S]],
                 produce: Callable[[S, Write], Awaitable[None]], media_type: str, *,
                 write_timeout: float = WRITE_TIMEOUT_SECONDS) -> None:
        super().__init__(status_code=200, media_type=media_type,
                         headers={"cache-control": "no-store", "x-accel-buffering": "no"})
        # a streamed body has no length: Response's ``content-length: 0`` would cut it (the front end
        # frames it chunked)
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._source = source
        self._produce = produce
        self._write_timeout = write_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self._source() as source:
            await self._stream(source, receive, send)

    async def _stream(self, source: S, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        gone = False

        async def write(data: bytes) -> None:
            nonlocal gone
            with trio.move_on_after(self._write_timeout) as timer:
                try:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                except Exception:  # the client went (ClientGone, a broken stream): stop producing, quietly
                    gone = True
            if timer.cancelled_caught:
                gone = True  # the client takes nothing: dropped (the answer is cut, the connection closed)
            if gone:
                nursery.cancel_scope.cancel()
                await trio.lowlevel.checkpoint()  # (raises Cancelled: the scope is cancelled)

        async with trio.open_nursery() as nursery:
            async def until_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_gone)
            await self._produce(source, write)
            nursery.cancel_scope.cancel()
        if not gone:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_event(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class GraphState:
    """The objects a watch has shown so far, by node id, and its last problems."""

    def __init__(self) -> None:
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.problems: list[dict[str, Any]] = []
        self.hint: str | None = None

    def apply(self, update: UpdateLike) -> bool:
        """Take one update; True when the problems changed too."""
        if update.type == "RESYNC":
            snapshot: SnapshotLike | None = update.snapshot
            self.objects = {node_id(o): o for o in (snapshot.objects if snapshot is not None else ())}
            problems = [kasd_problem(p) for p in (snapshot.problems if snapshot is not None else ())]
            changed = problems != self.problems
            self.problems, self.hint = problems, snapshot.hint if snapshot is not None else None
            return changed
        if update.object is None:
            return False
        key = node_id(update.object)
        if update.type == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = update.object
        return False

    def values(self) -> Iterable[Mapping[str, Any]]:
        return self.objects.values()


class SharedGraph:
    """The ``graph`` event of one live view's latest state, built once for all its viewers: a viewer
    whose objects are the very ones the last build saw (the view hands every viewer the same
    objects) gets those bytes; any other state is built anew."""

    def __init__(self, graph_of: Callable[[Iterable[Mapping[str, Any]]], dict[str, Any]]) -> None:
        self._graph_of = graph_of
        self._objects: dict[str, Mapping[str, Any]] = {}
        self._event: bytes | None = None
        self.viewers = 0
        #: graphs built (for tests)
        self.builds = 0

    def event(self, objects: Mapping[str, Mapping[str, Any]]) -> bytes:
        last = self._objects
        if self._event is not None and len(objects) == len(last) and \
                all(last.get(key) is obj for key, obj in objects.items()):
            return self._event
        self.builds += 1
        self._event = sse_event("graph", self._graph_of(objects.values()))
        self._objects = dict(objects)  # (held: an object seen cannot be freed and its id reused)
        return self._event


class SharedGraphs:
    """One ``SharedGraph`` per live view that has viewers (by key), dropped with its last viewer."""

    def __init__(self) -> None:
        self._views: dict[Hashable, SharedGraph] = {}

    @contextmanager
    def joined(self, key: Hashable, graph_of: Callable[[Iterable[Mapping[str, Any]]], dict[str, Any]]
               ) -> Iterator[SharedGraph]:
        shared = self._views.get(key)
        if shared is None:
            shared = self._views[key] = SharedGraph(graph_of)
        shared.viewers += 1
        try:
            yield shared
        finally:
            shared.viewers -= 1
            if not shared.viewers and self._views.get(key) is shared:
                del self._views[key]

    def __len__(self) -> int:
        return len(self._views)


def graph_events(watch: Callable[[], AbstractAsyncContextManager[AsyncIterator[UpdateLike]]],
                 graph_of: Callable[[Iterable[Mapping[str, Any]]], dict[str, Any]], *,
                 heartbeat: float = HEARTBEAT_SECONDS, coalesce: float = COALESCE_SECONDS,
                 shared: tuple[SharedGraphs, Hashable] | None = None,
                 write_timeout: float = WRITE_TIMEOUT_SECONDS, shown: tuple[type[Exception], ...] = ()) -> Response:
    """``text/event-stream``: ``graph`` (the whole graph JSON) after each batch of updates,
    ``problems`` when they change, ``: ping`` every ``heartbeat`` seconds; when the view drops this
    viewer (too slow) or fails, an ``end`` event saying so, and the stream ends. ``shared``: where
    the viewers of the same view (the key: environment and viewer identity) share each graph."""

    async def produce(updates: AsyncIterator[UpdateLike], write: Write) -> None:
        if shared is None:
            await _produce_graphs(updates, write, SharedGraph(graph_of), heartbeat, coalesce, shown)
        else:
            graphs, key = shared
            with graphs.joined(key, graph_of) as graph:
                await _produce_graphs(updates, write, graph, heartbeat, coalesce, shown)

    return _Producer(watch, produce, "text/event-stream", write_timeout=write_timeout)


async def _produce_graphs(updates: AsyncIterator[UpdateLike], write: Write, graph: SharedGraph, heartbeat: float,
                          coalesce: float, shown: tuple[type[Exception], ...]) -> None:
    """``graph_events``' body: ``graph`` from ``graph`` after each batch, ``problems``, pings, ``end``."""
    state = GraphState()
    wake = trio.Event()
    pending = {"graph": False, "problems": False}
    ended: list[str] = []

    async def pump(updates: AsyncIterator[UpdateLike]) -> None:
        nonlocal wake
        try:
            async for update in updates:
                if state.apply(update):
                    pending["problems"] = True
                pending["graph"] = True
                wake.set()
        except Exception as exc:  # ViewerTooSlow, or the view failed: say so, then end
            ended.append(ended_because(exc, shown))
        else:
            ended.append("the watch ended")
        wake.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, updates)
        await write(b": connected\n\n")
        while True:
            with trio.move_on_after(heartbeat):
                await wake.wait()
            if not wake.is_set():
                await write(b": ping\n\n")
                continue
            if not ended:
                await trio.sleep(coalesce)  # gather a burst of updates into one event
            wake = trio.Event()
            if pending["graph"]:
                pending["graph"] = False
                await write(graph.event(state.objects))
            if pending["problems"]:
                pending["problems"] = False
                await write(sse_event("problems", {"problems": state.problems, "hint": state.hint}))
            if ended:
                await write(sse_event("end", {"message": ended[0]}))
                nursery.cancel_scope.cancel()
                return


def text_stream(stream: Callable[[], AbstractAsyncContextManager[AsyncIterator[bytes]]], *,
                shown: tuple[type[Exception], ...] = ()) -> Response:
    """``text/plain``, chunked: what ``stream()`` gives, as it comes."""

    async def produce(chunks: AsyncIterator[bytes], write: Write) -> None:
        try:
            async for chunk in chunks:
                if chunk:
                    await write(chunk)
        except Exception as exc:  # the cluster ended it (pod gone, container not found …): say so in the text
            await write(f"\n[kasd: the log stream ended: {ended_because(exc, shown)[:300]}]\n".encode())

    return _Producer(stream, produce, "text/plain; charset=utf-8")
