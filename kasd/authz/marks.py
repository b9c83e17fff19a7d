"""``Mark``: a place in a configuration file, as every error about the file names it. Its own module
so the values of each part of ``config.yaml`` (``agentconfig``, ``services``) can carry one without
importing the reader.

May import: attrs.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Mark:
    """A place in a file, 1-based, as editors count."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


__all__ = ["Mark"]
