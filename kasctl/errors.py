"""The one failure a kasctl command reports: a mistake in its command line or its inputs."""

from __future__ import annotations

__all__ = ["CommandError"]


class CommandError(Exception):
    """A mistake in a command line or its inputs: one line on stderr, exit 2."""
