"""The one request id that follows a request across kasd, a peer kasd and agentd.

kasd gives each request it proxies an id: the client's own ``X-Request-Id`` when it is short and of
a safe charset (``is_safe``), otherwise a new one (``new_request_id``). The id is in every log line
about the request (``request_id=…``), in the response's ``X-Request-Id`` header, in the stream's
OPEN metadata (``request_id``, read by a peer kasd and by agentd) and in the request agentd sends on
(``X-Request-Id``). GitLab's components name it the same way: labkit's correlation id travels as
``X-Request-Id`` and GitLab answers with it in ``X-Request-Id``.

An id that is not safe is never used, logged or echoed: it is replaced (kasd) or dropped (a peer
kasd, agentd), so no value from a stranger reaches a log line or a response header.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import TypeGuard

#: the header (names lower-case) a client may send its id in, and kasd answers with
REQUEST_ID_HEADER = "x-request-id"
#: the longest id kept (a GitLab correlation id is 26 characters, a UUID 36)
MAX_REQUEST_ID = 64
_SAFE = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_REQUEST_ID}}}")


def is_safe(value: object) -> TypeGuard[str]:
    """Whether ``value`` may be an id: a string of 1 to 64 characters of ``A-Z a-z 0-9 . _ -``."""
    return isinstance(value, str) and _SAFE.fullmatch(value) is not None


def new_request_id() -> str:
    """A fresh id: 16 random bytes in hex (32 characters)."""
    return os.urandom(16).hex()


def request_id_from(headers: Iterable[tuple[str, str]]) -> str:
    """The id of a request with ``headers`` (names lower-case): its one safe ``X-Request-Id``, else a
    new one (none, two, or one that is too long or holds other characters)."""
    found = [value for name, value in headers if name == REQUEST_ID_HEADER]
    if len(found) == 1 and is_safe(found[0]):
        return found[0]
    return new_request_id()


def received_request_id(value: object) -> str:
    """An id as a peer or kasd sent it in the OPEN metadata: itself when safe, else ``""`` (none)."""
    return value if is_safe(value) else ""
