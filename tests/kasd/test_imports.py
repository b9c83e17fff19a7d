"""A lone kasd (no ``routing.redis``) loads nothing of Redis: coredis (with beartype under it) is a
third of kasd's start-up imports, paid by every kasd process, every CLI call and every test stack
that has no Redis. ``kasd.replicas`` loads the Redis membership and directory when one is configured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

#: what only a kasd among replicas needs
_REDIS = ("coredis", "beartype", "routing.redisconn", "routing.membership", "routing.directory")


def test_starting_kasd_without_redis_imports_no_redis_client() -> None:
    code = "import json, sys, kasd.__main__; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True)
    loaded = json.loads(result.stdout)
    assert [m for m in loaded if m.startswith(_REDIS)] == []
