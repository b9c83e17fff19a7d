"""``store:``: where what must outlive the process (finished jobs) is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from daemonkit.settings import Problem, setting
from kasd.config.values import expect_type


def _store_path(value: Any) -> Path | None:
    if value is None:
        return None
    text = expect_type(value, str, "a file path").strip()
    if not text:
        raise Problem("must be a file path (or left out: $STATE_DIRECTORY/kasd.sqlite3)")
    path = Path(text)
    if path.is_dir():
        raise Problem(f"{text!r} is a directory; name the file, e.g. {str(path / STORE_FILE_NAME)!r}")
    return path


#: the store's file name in systemd's ``$STATE_DIRECTORY`` (``StateDirectory=kasd``: /var/lib/kasd)
STORE_FILE_NAME = "kasd.sqlite3"


@attrs.frozen(kw_only=True)
class StoreSettings:
    """What must outlive the process (finished jobs). Among replicas it is kept in ``routing.redis``
    and ``path`` is not used."""

    path: Path | None = setting(
        None, parse=_store_path, env="KASD_STORE_PATH", flag="--store-path", metavar="FILE",
        help=f"a lone kasd's SQLite store (default $STATE_DIRECTORY/{STORE_FILE_NAME}; neither: in memory only)",
    )
