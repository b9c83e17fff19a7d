"""What a protocol front end hands the request pipeline: one ``Exchange`` per client request.

A front end (``http1``, ``http2``) turns bytes into exchanges and knows nothing of tokens, agents or
tunnels; the pipeline (``pipeline``) decides everything and speaks to the client only through the
exchange. This module is the whole contract between the two, so a new front end (or a test's fake
one) implements ``Exchange`` and nothing else.

May import: the standard library, attrs, trio. Never a front end, the pipeline or a seam.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

Headers = Sequence[tuple[str, str]]


class ClientGone(Exception):
    """The client closed or broke its connection (or reset its stream): nobody is listening."""


#: what a broken connection raises where a front end does not turn it into ``ClientGone``: the end
#: of a connection, never a bug (the proxy's listener ends the connection on it, quietly)
CONNECTION_LOST = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError)


@attrs.frozen(kw_only=True)
class ClientRequest:
    """A request head as the client sent it (header names lower-case, pseudo-headers removed)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    #: for the access log: ``HTTP/1.1``, ``HTTP/1.0``, ``HTTP/2``
    protocol: str
    peer: str
    #: the client asked to switch protocols (``Upgrade``): a ``101`` answer turns into a byte pipe
    upgrade: bool = False
    #: the head announced a body (Content-Length > 0, chunked, or an HTTP/2 stream left open)
    has_body: bool = False


class Exchange(Protocol):
    """One client request and the means to answer it. Every awaitable method raises ``ClientGone``
    once the client cannot be reached."""

    request: ClientRequest

    #: the nursery helper tasks of this exchange run in (the pipeline waits for them before returning)
    nursery: trio.Nursery
    #: True if noticing the client leaving takes a read (HTTP/1.1); HTTP/2's connection reader
    #: notices a reset by itself and cancels the exchange
    watches_client: bool

    @property
    def client_gone(self) -> bool:
        """The client left (reset its stream, closed its connection) during the exchange."""
        ...

    def take_empty_body(self) -> bool:
        """True if the request body is complete and empty and already taken (no reader needed)."""
        ...

    async def receive_body(self) -> bytes:
        """The next piece of the request body; ``b""`` once it is all in."""
        ...

    async def watch_client(self) -> None:
        """After the body: return when the client leaves (raising ``ClientGone``) or sends early
        bytes (kept for the next request or the upgraded stream). Cancelled when no longer needed."""
        ...

    async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
        """Send the response head and the first part of the body (all of it if ``end``)."""
        ...

    async def send_error(self, status: int, headers: Headers, body: bytes) -> None:
        """Answer with a complete error response (a head and a body) the pipeline composed."""
        ...

    async def send(self, data: bytes) -> None:
        """More of the response body."""
        ...

    async def end(self) -> None:
        """The response body is complete."""
        ...

    def abort(self) -> None:
        """The response cannot be completed: show the client a truncated body (a cut connection,
        or a reset stream), never a clean end."""
        ...

    async def upgrade(self, headers: Headers) -> tuple[trio.abc.Stream, bytes]:
        """Send ``101`` with ``headers``; the client's connection as a byte stream, and what the
        client already sent after its request."""
        ...
