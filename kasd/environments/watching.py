"""One environment's live view for one kind of viewer (``WatchSet``), shared by all its viewers.

The set discovers the environment (``discover``), sends every viewer a ``RESYNC``, then WATCHes from
each list's resourceVersion (``allowWatchBookmarks``): the dependent kinds (``kinds.DEPENDENT``:
ReplicaSets, Pods, Jobs, EndpointSlices) whole in each namespace, filtered here to the environment's
members (a new ReplicaSet of a labelled Deployment, then its Pods, join as their events come, in
whatever order); the other kinds by the label selector — those with a labelled object at discovery
and the common workload kinds (``ALWAYS_WATCHED``) whether or not they had one. A kind that first
appears later (a custom resource), and the unlabelled objects a new Pod uses, are found by
discovering again: at once (debounced by ``REDISCOVER_DELAY``) when a member Pod uses an object the
set does not hold, and every ``rediscover_interval`` anyway. Cost per environment and viewer key:
one watch per namespace of each watched kind (four dependent kinds, the always-watched ones and those
found), each one tunnel stream to the agent, held while someone looks.

A watch that ends with 410 Gone, an ERROR event, or a broken stream makes the set discover again
(a ``RESYNC``); when the agent is away, it tries again with backoff (``limits.backoff``). A
discovery in which a kind timed out or failed (so that kind is not watched) is tried again with the
same backoff, the other watches running meanwhile, rather than at the next periodic discovery. A watch the
API server ends cleanly (its timeout) is resumed from the last resourceVersion seen.

Each viewer has a bounded channel (``limits.viewer_queue``): a viewer whose channel is full when an
update comes is dropped (its channel closed; its iterator raises ``ViewerTooSlow``), never buffered
without limit.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import trio

from daemonkit.logs import BurstLimitedLog
from kasd.agentclient import AgentApi, AgentRequestError
from kasd.environments.discover import Discovered, discover
from kasd.environments.kinds import ApiKind
from kasd.environments.objects import (
    SERVICE_NAME_LABEL,
    adopted,
    adoption_index,
    group_of,
    label_selector,
    labelled,
    node_id,
    references,
    sanitize,
)
from kasd.environments.values import (
    EnvironmentRef,
    KindProblem,
    Snapshot,
    Update,
    Viewer,
    ViewerTooSlow,
    ViewLimits,
)

#: (group, Kind) watched by label whether or not discovery found one: what deployments usually make
ALWAYS_WATCHED = frozenset({
    ("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "DaemonSet"), ("", "Service"),
    ("networking.k8s.io", "Ingress"), ("batch", "CronJob"), ("", "ConfigMap"), ("", "Secret"),
    ("", "PersistentVolumeClaim"), ("", "ServiceAccount"), ("autoscaling", "HorizontalPodAutoscaler"),
})

_failures = BurstLimitedLog(logging.getLogger("kasd.environments"), interval=10.0)

#: seconds between a member Pod using an object the set lacks and the discovery that fetches it
REDISCOVER_DELAY = 1.0

#: a watch the server ended cleanly sooner than this is treated as broken (no reconnect loop)
MIN_WATCH_LIFE = 1.0


class Subscription:
    """One viewer's updates: iterate it; ``ViewerTooSlow`` when it was dropped for falling behind."""

    def __init__(self, size: int) -> None:
        self.send, self.receive = trio.open_memory_channel[Update](size)
        self.too_slow = False

    def __aiter__(self) -> AsyncIterator[Update]:
        return self

    async def __anext__(self) -> Update:
        try:
            return await self.receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            if self.too_slow:
                raise ViewerTooSlow("this viewer fell behind the environment's updates and was dropped") from None
            raise StopAsyncIteration from None


class _Resync(Exception):
    """A watch ended in a way that needs a new list (410 Gone, an ERROR event, a broken stream)."""


class WatchSet:
    """The shared watches of one environment for one viewer key (see the module's docstring)."""

    def __init__(self, api: AgentApi, env: EnvironmentRef, viewer: Viewer, limits: ViewLimits) -> None:
        self.api, self.env, self.viewer, self.limits = api, env, viewer, limits
        self.subscribers: list[Subscription] = []
        self.current: Snapshot | None = None
        self.members: dict[str, Mapping[str, Any]] = {}
        self.candidates: dict[str, Mapping[str, Any]] = {}
        self._uids: dict[str, str] = {}
        self._unreadable: set[str] = set()
        self.problems: tuple[KindProblem, ...] = ()
        self.hint: str | None = None
        #: upstream WATCH requests this set opened (for tests and metrics)
        self.watches_opened = 0
        self.discoveries = 0
        #: viewers dropped for falling behind (their channel was full)
        self.dropped = 0
        #: the members are as current as the watches: discovered, and every watch running since
        self.live = False
        #: the last watches ended to retry an incomplete discovery
        self._retrying = False
        self._soon = trio.Event()
        self._turn = trio.StrictFIFOLock()
        self.cancel_scope = trio.CancelScope()

    # ---- viewers

    def join(self) -> Subscription:
        subscription = Subscription(self.limits.viewer_queue)
        self.subscribers.append(subscription)
        if self.current is not None:
            self._deliver(subscription, Update("RESYNC", None, self.snapshot()))
        return subscription

    def leave(self, subscription: Subscription) -> None:
        if subscription in self.subscribers:
            self.subscribers.remove(subscription)
        subscription.send.close()

    def snapshot(self) -> Snapshot:
        return Snapshot(tuple(self.members[i] for i in sorted(self.members)), self.problems, self.hint)

    def _publish(self, update: Update) -> None:
        for subscription in list(self.subscribers):
            self._deliver(subscription, update)

    def _deliver(self, subscription: Subscription, update: Update) -> None:
        try:
            subscription.send.send_nowait(update)
        except trio.WouldBlock:
            subscription.too_slow = True
            self.dropped += 1
            self.leave(subscription)
        except trio.ClosedResourceError:
            self.leave(subscription)

    # ---- the loop

    async def run(self) -> None:
        """Discover, watch, and again when a watch breaks, until cancelled (``cancel_scope``)."""
        with self.cancel_scope:
            wait = self.limits.backoff[0]
            while True:
                began = trio.current_time()
                try:
                    found = await discover(self.api, self.env, self.viewer, self.limits)
                except AgentRequestError as exc:
                    self.live = False
                    self.problems = (KindProblem("", "", "", "", "error", exc.message),)
                    self._resync()
                    await trio.sleep(wait)
                    wait = min(wait * 2, self.limits.backoff[1])
                    continue
                self.discoveries += 1
                self._load(found)
                self._resync()
                # a kind not listed in time (or failing) is not watched: discover again soon, with
                # backoff, rather than at the next periodic discovery (many views opening at once
                # can make some lists time out); a limit's problem (too many objects, namespaces) is
                # not one: discovering again every 30 s would only list the same too many again
                incomplete = any(p.reason in ("timeout", "error") for p in self.problems if p not in found.over_limits)
                self._retrying = False
                try:
                    self.live = True
                    await self._watch_all(found, wait if incomplete else None)
                except Exception as exc:  # a bug here must not end kasd's other views: logged, retried
                    _failures.log(logging.ERROR, self.env.id, "environment watch set failed environment=%s "
                                  "viewer=%s error=%r", self.env.id, self.viewer.key, exc)
                finally:
                    self.live = False  # a watch broke (or it is time to discover again): not current
                if self._retrying:  # (the watches ran meanwhile: no further wait)
                    wait = min(wait * 2, self.limits.backoff[1])
                elif trio.current_time() - began < self.limits.backoff[1]:
                    await trio.sleep(wait)  # a watch broke soon after it began: do not hammer the agent
                    wait = min(wait * 2, self.limits.backoff[1])
                else:
                    wait = self.limits.backoff[0]

    def _load(self, found: Discovered) -> None:
        self.members = dict(found.members)
        self.candidates = dict(found.candidates)
        self._uids = {str((o.get("metadata") or {}).get("uid")): i for i, o in self.members.items()}
        self.problems, self.hint = found.snapshot.problems, found.snapshot.hint
        # what the members use that discovery could not read (forbidden, missing): no reason to
        # discover again when the next Pod uses it too
        self._unreadable = _reference_ids(self.members.values()) - set(self.members)

    def _resync(self) -> None:
        self.current = self.snapshot()
        self._publish(Update("RESYNC", None, self.current))

    async def _watch_all(self, found: Discovered, retry_in: float | None = None) -> None:
        """Until one watch needs a new list, or it is time to discover again (after ``retry_in``
        seconds when the discovery was incomplete)."""
        self._soon = trio.Event()
        found_kinds = {(group_of(o), str(o.get("kind"))) for o in found.members.values()}
        watched = [k for k in found.kinds
                   if k.dependent or (k.group, k.kind) in ALWAYS_WATCHED or (k.group, k.kind) in found_kinds]
        async with trio.open_nursery() as nursery:
            for kind in watched:
                for namespace in found.namespaces:
                    version = found.versions.get((kind.group, kind.plural, namespace))
                    if version is not None:  # listed (not forbidden, not timed out)
                        nursery.start_soon(self._watch_one, kind, namespace, version, nursery.cancel_scope)
            nursery.start_soon(self._rediscover_later, nursery.cancel_scope, retry_in)

    async def _rediscover_later(self, scope: trio.CancelScope, retry_in: float | None) -> None:
        with trio.move_on_after(self.limits.rediscover_interval):
            with trio.move_on_after(retry_in if retry_in is not None else math.inf) as retry:
                await self._soon.wait()
                await trio.sleep(REDISCOVER_DELAY)
            self._retrying = retry.cancelled_caught
        scope.cancel()

    async def _watch_one(self, kind: ApiKind, namespace: str, version: str, scope: trio.CancelScope) -> None:
        try:
            while True:
                version = await self._watch_once(kind, namespace, version)
        except (_Resync, AgentRequestError):
            scope.cancel()

    async def _watch_once(self, kind: ApiKind, namespace: str, version: str) -> str:
        """Watch until the server ends the stream; the last resourceVersion seen. ``_Resync`` when a
        new list is needed."""
        query = {"watch": "1", "allowWatchBookmarks": "true", "resourceVersion": version}
        if not kind.dependent:
            query["labelSelector"] = label_selector(self.env.project_id, self.env.slug)
        target = kind.path(namespace) + "?" + urlencode(query, quote_via=quote)
        began = trio.current_time()
        async with self.api.open(self.viewer.agent_id, "GET", target, impersonate=self.viewer.identity) as answer:
            self.watches_opened += 1
            if answer.status == 200:
                async for line in _lines(answer.chunks(), self.limits.max_answer_bytes):
                    # One event at a time for the whole set, each followed by a schedule point: the
                    # viewers' tasks take each update before the next, so a burst (a chunk of many
                    # events, several watches at once) does not fill the queue of a viewer that keeps up.
                    async with self._turn:
                        version = self._event(kind, line, version)
                        await trio.lowlevel.checkpoint()
            elif answer.status != 403:
                raise _Resync
        if answer.status == 403:  # may list but not watch: the next discovery lists it again
            await trio.sleep_forever()
        if trio.current_time() - began < MIN_WATCH_LIFE:
            raise _Resync
        return version

    def _event(self, kind: ApiKind, line: bytes, version: str) -> str:
        """Apply one watch line; the resourceVersion to resume from. ``_Resync`` for an ERROR
        (410 Expired among them) or a line that is not an event."""
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # (nested deeper than Python's stack)
            raise _Resync from None
        kind_of_event = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if kind_of_event not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") or not isinstance(obj, dict):
            raise _Resync
        if kind_of_event != "BOOKMARK":
            self._apply(kind_of_event, sanitize(obj, api_version=kind.api_version, kind=kind.kind))
        return str((obj.get("metadata") or {}).get("resourceVersion") or version)

    # ---- membership

    def _is_member(self, obj: Mapping[str, Any]) -> bool:
        if labelled(obj, self.env.project_id, self.env.slug):
            return True
        meta = obj.get("metadata") or {}
        if any(isinstance(r, dict) and str(r.get("uid")) in self._uids for r in meta.get("ownerReferences") or ()):
            return True
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        return obj.get("kind") == "EndpointSlice" and f"/Service/{meta.get('namespace')}/{service}" in self.members

    def _apply(self, event: str, obj: Mapping[str, Any]) -> None:
        ident = node_id(obj)
        if event == "DELETED":
            self.candidates.pop(ident, None)
            if self.members.pop(ident, None) is not None:
                self._uids.pop(str((obj.get("metadata") or {}).get("uid")), None)
                self._publish(Update("DELETED", obj, None))
            return
        if self._is_member(obj) or (ident in self.members and not group_of(obj) and
                                    obj.get("kind") in ("ConfigMap", "Secret", "ServiceAccount",
                                                        "PersistentVolumeClaim", "PersistentVolume")):
            self._add(ident, obj)
            return
        if self.members.pop(ident, None) is not None:  # lost its labels, or its owner
            self._uids.pop(str((obj.get("metadata") or {}).get("uid")), None)
            self._publish(Update("DELETED", obj, None))
        if (group_of(obj), obj.get("kind")) in _DEPENDENT_KINDS and (
                ident in self.candidates or len(self.candidates) < self.limits.max_objects):
            self.candidates[ident] = obj

    def _add(self, ident: str, obj: Mapping[str, Any]) -> None:
        # A new member adopts the candidates that came before it (a Pod's event may beat its
        # ReplicaSet's), and they theirs: a walk over one index of the candidates built for this
        # event, not a scan of every candidate per object adopted — owner references are the
        # tenant's to write, and a chain of thousands must cost one pass, not a pass per link
        # (nor a Python frame per link).
        index: dict[str, list[str]] | None = None
        todo = [(ident, obj)]
        queued: set[str] = set()
        while todo:
            ident, obj = todo.pop()
            if ident not in self.members and len(self.members) >= self.limits.max_objects:
                continue
            self.candidates.pop(ident, None)
            added = ident not in self.members
            self.members[ident] = obj
            self._uids[str((obj.get("metadata") or {}).get("uid"))] = ident
            self._publish(Update("ADDED" if added else "MODIFIED", obj, None))
            if added and self.candidates:
                if index is None:
                    index = adoption_index(self.candidates.items())
                for child in adopted(index, obj):
                    if child in self.candidates and child not in queued:
                        queued.add(child)
                        todo.append((child, self.candidates[child]))
            if obj.get("kind") == "Pod" and not group_of(obj) and any(
                    r not in self.members and r not in self._unreadable for r in _reference_ids([obj])):
                self._soon.set()


_DEPENDENT_KINDS = frozenset({("apps", "ReplicaSet"), ("", "Pod"), ("batch", "Job"),
                             ("discovery.k8s.io", "EndpointSlice")})

_KINDS = {"configmaps": "ConfigMap", "secrets": "Secret", "persistentvolumeclaims": "PersistentVolumeClaim",
          "serviceaccounts": "ServiceAccount", "persistentvolumes": "PersistentVolume"}


def _reference_ids(objects: Iterable[Mapping[str, Any]]) -> set[str]:
    return {f"{g}/{_KINDS.get(p, p)}/{ns}/{name}" for g, p, ns, name in references(objects)}


async def _lines(chunks: AsyncIterator[bytes], max_line: int) -> AsyncIterator[bytes]:
    """The non-empty lines of a watch body; ``_Resync`` for a line over ``max_line`` bytes."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end])
            start = end + 1
            if line.strip():
                yield line
        del buffer[:start]
        if len(buffer) > max_line:
            raise _Resync
    if buffer.strip():
        yield bytes(buffer)


__all__ = ["ALWAYS_WATCHED", "Subscription", "WatchSet"]
