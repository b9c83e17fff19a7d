"""``web:``: the environments API and dashboard on the API port (``kasd.web``)."""

from __future__ import annotations

import re
from typing import Any

import attrs

from daemonkit.settings import Problem, setting

_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
#: origins at most (each is compared on every cross-origin request)
MAX_ORIGINS = 32


def _origins(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise Problem("must be a list of origins like https://dashboard.example.com")
    if len(items) > MAX_ORIGINS:
        raise Problem(f"at most {MAX_ORIGINS} origins")
    out = []
    for item in items:
        origin = item.strip()
        if origin == "*" or not _ORIGIN.fullmatch(origin):
            raise Problem(f"{origin[:100]!r} is not an origin: scheme://host[:port], no path, no '*' (a page of "
                          "any site must not use a signed-in user's session)")
        out.append(origin.lower())
    return tuple(out)


@attrs.frozen(kw_only=True)
class WebConfig:
    cors_origins: tuple[str, ...] = setting(
        (), parse=_origins, env="KASD_WEB_CORS_ORIGINS", env_split=",", flag="--web-cors-origin",
        flag_action="append", metavar="ORIGIN",
        help="an origin (https://host[:port]) whose pages may call the environments API across origins; "
             "repeatable; none by default",
    )
