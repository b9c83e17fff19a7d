"""``EnvironmentViews``: the shell's one object per kasd process — discovery (``snapshot``), shared
live views (``watch``), one request (``request``: an object's YAML, its events, delete a pod, annotate
a Flux object) and one streamed answer (``stream``: a pod's log, followed), all through the Router
as the agent or the viewing user (``Viewer``).

``run`` holds the watch sets' tasks: ``await nursery.start(views.run)`` before the first ``watch``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import attrs
import trio

from kasd.agentclient import AgentApi, AgentRequestError, Answer
from kasd.environments.discover import discover
from kasd.environments.objects import sanitize_answer
from kasd.environments.values import EnvironmentRef, Snapshot, Update, Viewer, ViewLimits
from kasd.environments.watching import Subscription, WatchSet
from kasd.seams import Router

#: the only paths ``stream`` serves: a pod's log (a watch or any other stream goes through ``watch``)
_POD_LOG = re.compile(r"/api/v1/namespaces/[a-z0-9]([-a-z0-9]*[a-z0-9])?/pods/[a-z0-9]([-.a-z0-9]*[a-z0-9])?/log")
_SECRETS = re.compile(r"/api/v1/(namespaces/[^/]+/)?secrets(/|$)")


@attrs.frozen(kw_only=True)
class ViewsStatistics:
    watch_sets: int
    viewers: int
    #: upstream WATCH requests opened since the start, by every set
    watches_opened: int
    discoveries: int
    #: viewers dropped since the start for falling behind (``ViewerTooSlow``)
    viewers_dropped: int = 0
    #: ``snapshot`` calls: answered by a discovery of their own, by one another caller ran at the
    #: same time, by a live view's objects
    snapshots_discovered: int = 0
    snapshots_shared: int = 0
    snapshots_from_views: int = 0


class _Flight:
    """One discovery that callers of ``snapshot`` asking at the same time wait for."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Snapshot | None = None
        self.error: AgentRequestError | None = None


class EnvironmentViews:
    """See the module's docstring. ``limits`` bounds every discovery and watch set; the keyword
    arguments the contract names (``max_concurrency``, ``time_cap``) override its fields."""

    def __init__(self, router: Router, *, max_concurrency: int | None = None, time_cap: float | None = None,
                 limits: ViewLimits | None = None) -> None:
        limits = limits or ViewLimits()
        if max_concurrency is not None:
            limits = attrs.evolve(limits, max_concurrency=max_concurrency)
        if time_cap is not None:
            limits = attrs.evolve(limits, time_cap=time_cap)
        self.limits = limits
        self.api = AgentApi(router, user_agent="kasd/environments")
        self._sets: dict[tuple[int, int, str], WatchSet] = {}
        self._nursery: trio.Nursery | None = None
        self._opened_before = 0
        self._discoveries_before = 0
        self._dropped_before = 0
        self._flights: dict[tuple[Any, ...], _Flight] = {}
        self._snapshot_discoveries = 0
        self._shared_discoveries = 0
        self._from_views = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the watch sets' tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def snapshot(self, env: EnvironmentRef, viewer: Viewer) -> Snapshot:
        """``env``'s objects as ``viewer`` sees them now; ``AgentRequestError`` if the agent could
        not be asked at all. The caller holds the deadline (``limits.time_cap`` bounds it anyway).

        No discovery when it can be spared: while a live view of ``env`` for the same viewer key is
        current (discovered, every watch running), its objects are the answer; and callers asking
        at the same time (the dashboard opens an environment with two requests; a page of
        environments asks each one's health) share one discovery."""
        key = (env.id, viewer.agent_id, viewer.key)
        watch_set = self._sets.get(key)
        if watch_set is not None and watch_set.live and tuple(watch_set.env.namespaces) == tuple(env.namespaces):
            self._from_views += 1
            return watch_set.snapshot()
        flight_key = (*key, env.project_id, env.slug, tuple(env.namespaces))
        flight = self._flights.get(flight_key)
        if flight is not None:
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.result is not None:
                self._shared_discoveries += 1
                return flight.result
            # (the caller that ran it went away before it ended: discover for this one)
        flight = self._flights[flight_key] = _Flight()
        try:
            self._snapshot_discoveries += 1
            flight.result = (await discover(self.api, env, viewer, self.limits)).snapshot
            return flight.result
        except AgentRequestError as exc:
            flight.error = exc
            raise
        finally:
            if self._flights.get(flight_key) is flight:
                del self._flights[flight_key]
            flight.done.set()

    @asynccontextmanager
    async def watch(self, env: EnvironmentRef, viewer: Viewer) -> AsyncIterator[AsyncIterator[Update]]:
        """Updates of ``env`` for ``viewer``, a ``RESYNC`` first; shared with every viewer of the
        same environment and key; the set closes when its last viewer leaves."""
        if self._nursery is None:
            raise RuntimeError("EnvironmentViews.run is not running")
        key = (env.id, viewer.agent_id, viewer.key)
        watch_set = self._sets.get(key)
        if watch_set is None:
            watch_set = self._sets[key] = WatchSet(self.api, env, viewer, self.limits)
            self._nursery.start_soon(watch_set.run)
        subscription: Subscription = watch_set.join()
        try:
            yield subscription
        finally:
            watch_set.leave(subscription)
            if not watch_set.subscribers and self._sets.get(key) is watch_set:
                del self._sets[key]
                watch_set.cancel_scope.cancel()
                self._opened_before += watch_set.watches_opened
                self._discoveries_before += watch_set.discoveries
                self._dropped_before += watch_set.dropped

    async def request(self, viewer: Viewer, method: str, target: str, *, body: Mapping[str, Any] | None = None,
                      accept: str = "application/json", content_type: str = "application/json") -> Answer:
        """One request as ``viewer``; the answer with every object sanitized (no Secret values, no
        managedFields). A Secret is always read as JSON, whatever ``accept`` asks (its values are
        dropped from the JSON; YAML would be passed through as sent). No watches here."""
        _refuse_watch(target)
        if _SECRETS.match(unquote(urlsplit(target).path)):  # (as the API server reads it: %73ecrets too)
            accept = "application/json"
        answer = await self.api.request(viewer.agent_id, method, target, body, impersonate=viewer.identity,
                                        accept=accept, content_type=content_type,
                                        max_bytes=self.limits.max_answer_bytes)
        if not answer.body:
            if "json" in answer.content_type and answer.raw:
                return attrs.evolve(answer, raw=b"")  # JSON, but not an object: nothing to pass on
            return answer
        body_out = sanitize_answer(answer.body)
        return attrs.evolve(answer, body=body_out, raw=json.dumps(body_out).encode(),
                            content_type="application/json")

    @asynccontextmanager
    async def stream(self, viewer: Viewer, target: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """A pod's log as it comes (``/api/v1/namespaces/NS/pods/NAME/log?follow=true&…``);
        ``AgentRequestError`` with the agent's status when it answered anything but 200. Only pod
        logs: any other target is a ``ValueError``."""
        if not _POD_LOG.fullmatch(urlsplit(target).path):
            raise ValueError("only a pod's log is streamed: /api/v1/namespaces/<namespace>/pods/<name>/log")
        _refuse_watch(target)
        async with self.api.open(viewer.agent_id, "GET", target, impersonate=viewer.identity,
                                 accept="text/plain, */*") as answer:
            if answer.status != 200:
                data = bytearray()
                async for chunk in answer.chunks():
                    data += chunk
                    if len(data) > 65536:
                        break
                try:
                    message = str(json.loads(bytes(data)).get("message") or "")
                except (ValueError, AttributeError, RecursionError):
                    message = ""
                raise AgentRequestError(answer.status, message or f"HTTP {answer.status}")
            yield answer.chunks()

    def statistics(self) -> ViewsStatistics:
        sets = list(self._sets.values())
        return ViewsStatistics(watch_sets=len(sets), viewers=sum(len(s.subscribers) for s in sets),
                               watches_opened=self._opened_before + sum(s.watches_opened for s in sets),
                               discoveries=self._discoveries_before + sum(s.discoveries for s in sets),
                               viewers_dropped=self._dropped_before + sum(s.dropped for s in sets),
                               snapshots_discovered=self._snapshot_discoveries,
                               snapshots_shared=self._shared_discoveries, snapshots_from_views=self._from_views)


def _refuse_watch(target: str) -> None:
    parts = urlsplit(target)
    query = parse_qs(parts.query)
    if "/watch/" in parts.path or any(v.lower() in ("1", "true") for v in query.get("watch", ())):
        raise ValueError("a watch goes through EnvironmentViews.watch, whose objects are sanitized")


__all__ = ["EnvironmentViews", "ViewsStatistics"]
