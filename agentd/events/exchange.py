"""One small HTTP/1.1 exchange through ``agentd.upstream.UpstreamPool`` (agentd's one HTTP client),
its answer read whole up to a bound, and ``Attempt``: how one try of an action went."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from agentd.upstream import UpstreamPool
from tunnelhttp.head import RequestHead


@attrs.frozen(kw_only=True)
class Attempt:
    """One try of one action: ``ok``, or why not; ``final`` when trying again cannot help."""

    ok: bool
    detail: str
    status: int | None = None
    final: bool = False


class ResponseTooLarge(Exception):
    """The answer's body is over the bound; ``status`` is its status (the head came)."""

    def __init__(self, status: int, limit: int) -> None:
        super().__init__(f"answer over {limit} bytes")
        self.status = status


class _Body(trio.abc.ReceiveStream):
    """``data`` once, then the end."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        data, self._data = self._data or b"", None
        return data

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def exchange(pool: UpstreamPool, method: str, target: str, headers: Sequence[tuple[str, str]],
                   body: bytes | None, *, max_response: int, request_id: str = "") -> tuple[int, bytes]:
    """Send one request; its status and body (at most ``max_response`` bytes, else
    ``ResponseTooLarge``). Raises what ``UpstreamPool.request`` raises; never follows a redirect."""
    sent = list(headers)
    if body is not None:
        sent.append(("content-length", str(len(body))))
    head = RequestHead(method=method, target=target, headers=tuple(sent), request_id=request_id)
    async with pool.request(head, None if body is None else _Body(body)) as response:
        chunks: list[bytes] = []
        size = 0
        while chunk := await response.receive_some():
            size += len(chunk)
            if size > max_response:
                raise ResponseTooLarge(response.status, max_response)
            chunks.append(chunk)
        return response.status, b"".join(chunks)


__all__ = ["Attempt", "ResponseTooLarge", "exchange"]
