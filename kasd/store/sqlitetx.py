"""``transaction``: the one way kasd's SQLite store writes, shared by its parts (``sqlite``,
``events_sqlite``) so neither imports the other for it.

May import: the standard library.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` (the write lock at once, so two writers never deadlock on an upgrade);
    ``COMMIT`` when the block ends, unless it already ended the transaction (a ``ROLLBACK`` of its
    own: a refusal that undoes what it began); ``ROLLBACK`` when it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    if db.in_transaction:
        db.execute("COMMIT")


__all__ = ["transaction"]
