"""``store:``: where what must outlive the process (finished jobs, environments) is kept; and
``environments:``, how much of their deployment history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from daemonkit.settings import Problem, setting
from kasd.config.values import expect_type, parse_count, parse_seconds


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


#: seconds a deployment is kept (``environments.history_retention``)
DEFAULT_HISTORY_RETENTION = 90 * 24 * 3600.0
#: deployments kept per environment (``environments.max_deployments``): the oldest go first
DEFAULT_MAX_DEPLOYMENTS = 100

_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(value: Any) -> float:
    """Seconds, or a number with a unit: ``90d``, ``36h``, ``30m``, ``45s``."""
    if not isinstance(value, str):
        return parse_seconds(value)
    text = value.strip()
    unit = _DURATION_UNITS.get(text[-1:].lower())
    try:
        return parse_seconds(float(text[:-1]) if unit else float(text)) * (unit or 1.0)
    except (ValueError, Problem):
        raise Problem(f"{value!r} is not a duration (seconds, or a number with s, m, h or d: 90d)") from None


@attrs.frozen(kw_only=True)
class EnvironmentSettings:
    """``environments:``: how much deployment history the store keeps (``kasd.store.deployments``)."""

    history_retention: float = setting(
        DEFAULT_HISTORY_RETENTION, parse=_duration, env="KASD_ENVIRONMENTS_HISTORY_RETENTION",
        flag="--environments-history-retention", metavar="DURATION",
        help="how long deployments are kept (seconds, or 90d, 36h…); a stopped environment unused that long is forgotten",
    )
    max_deployments: int = setting(
        DEFAULT_MAX_DEPLOYMENTS, parse=parse_count, env="KASD_ENVIRONMENTS_MAX_DEPLOYMENTS",
        flag="--environments-max-deployments", metavar="N", help="deployments kept per environment, the newest",
    )
