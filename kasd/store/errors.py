"""The store's one failure (``kasd.store.protocol`` re-exports it), in a room of its own so that
what the store keeps (``kasd.store.deployments``) and the store's Protocol need not import each other."""

from __future__ import annotations


class StoreError(Exception):
    """The store could not do what was asked (unreachable, full, a bad file); ``str()`` says why
    and is safe to show a client (no secret, no path beyond the store's own)."""


__all__ = ["StoreError"]
