"""Watch responses: an `application/json` stream of `{"type": …, "object": …}` lines.

Events come from the store's bounded channel; with `allowWatchBookmarks` a BOOKMARK goes out
whenever the stream has been quiet for the bookmark interval, and `sendInitialEvents` ends its
replay with the `k8s.io/initial-events-end` bookmark. A resourceVersion older than the store's
history is answered the way the watch cache does: an ERROR event carrying a 410 Expired Status.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import trio

from kubesim import tables
from kubesim.asgi import Query, Receive, Send, accept_form, flag, one, pump, start_stream
from kubesim.errors import ApiError
from kubesim.paths import Target
from kubesim.resources import Kind
from kubesim.selectors import parse_field_selector, parse_label_selector
from kubesim.store import Store


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _bookmark(kind: Kind, rv: int, *, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _line("BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta})


async def serve_watch(store: Store, target: Target, query: Query, accept: str, receive: Receive,
                      send: Send, *, bookmark_interval: float) -> None:
    kind = target.kind
    labels = parse_label_selector(one(query, "labelSelector"))
    fields = parse_field_selector(one(query, "fieldSelector"))
    only = target.name

    def predicate(obj: dict[str, Any]) -> bool:
        if only is not None and obj["metadata"]["name"] != only:
            return False
        return labels(obj) and fields(obj)

    send_initial_text = one(query, "sendInitialEvents")
    send_initial = None if send_initial_text is None else send_initial_text.lower() == "true"
    bookmarks = flag(query, "allowWatchBookmarks")
    timeout_text = one(query, "timeoutSeconds")
    timeout = float(timeout_text) if timeout_text and timeout_text.isdigit() else math.inf
    as_table = accept_form(accept) == "Table"
    include_object = one(query, "includeObject") or "Metadata"
    columns_sent = False

    def encode(event_type: str, obj: dict[str, Any]) -> bytes:
        nonlocal columns_sent
        obj = store.present(kind, obj)
        if as_table:
            # Column definitions go with the first event only, as the API server sends them.
            obj = tables.table(kind, [obj], include_object=include_object,
                               include_columns=not columns_sent)
            columns_sent = True
        return _line(event_type, obj)

    with contextlib.ExitStack() as stack:
        try:
            initial, channel = stack.enter_context(store.watch(
                kind, target.namespace, resource_version=one(query, "resourceVersion"),
                predicate=predicate, send_initial=send_initial))
        except ApiError as exc:
            if exc.code != 410:
                raise
            await start_stream(send, "application/json")
            await send({"type": "http.response.body", "more_body": False,
                        "body": _line("ERROR", exc.status())})
            return

        async def produce() -> AsyncIterator[bytes]:
            for event in initial:
                yield encode(event.type, event.object)
            if send_initial and bookmarks:
                yield _bookmark(kind, store.resource_version, initial_end=True)
            last_rv = store.resource_version
            with trio.move_on_after(timeout):
                while True:
                    with trio.move_on_after(bookmark_interval if bookmarks else math.inf) as quiet:
                        try:
                            event = await channel.receive()
                        except trio.EndOfChannel:
                            return
                    if quiet.cancelled_caught:
                        yield _bookmark(kind, max(last_rv, store.resource_version))
                        continue
                    last_rv = event.resource_version
                    yield encode(event.type, event.object)

        await start_stream(send, "application/json")
        await pump(produce(), receive, send)
