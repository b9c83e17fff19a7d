"""The fence around coredis's pub/sub (``routing.redisconn.subscription``): what coredis 6.9 raises
from inside its own task groups reaches the listeners as the plain Redis error they catch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import coredis.exceptions
import pytest

from routing.redisconn import REDIS_ERRORS, subscription

pytestmark = pytest.mark.timeout(10)


class _Client:
    """A client whose ``pubsub()`` fails on entry as coredis 6.9's does when the connection was lost
    just before SUBSCRIBE (``subscribe`` runs in coredis's task group: the error comes grouped)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @asynccontextmanager
    async def pubsub(self, channels: list[str]) -> AsyncIterator[Any]:
        raise self.error
        yield  # pragma: no cover


async def test_a_lost_connection_at_subscribe_is_a_plain_redis_error() -> None:
    lost = coredis.exceptions.ConnectionError("Connection not usable")
    with pytest.raises(REDIS_ERRORS) as caught:
        async with subscription(_Client(ExceptionGroup("", [ExceptionGroup("", [lost])])), ["ch"]):
            pass  # pragma: no cover
    assert caught.value is lost


async def test_a_group_holding_anything_else_stays_a_group() -> None:
    bug = ExceptionGroup("", [coredis.exceptions.ConnectionError("lost"), KeyError("a bug")])
    with pytest.raises(ExceptionGroup) as caught:
        async with subscription(_Client(bug), ["ch"]):
            pass  # pragma: no cover
    # (except* re-raises what it did not handle as a new group of the same errors)
    assert list(caught.value.exceptions) == list(bug.exceptions)
