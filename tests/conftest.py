"""Fixtures for every test directory."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something is already listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
