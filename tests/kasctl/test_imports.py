"""kasctl's client commands load no daemon: the REST paths they call come from ``kasd.restpaths``,
not from kasd's REST API module (which would pull in the ASGI port, managed namespaces and trio)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

#: what a kasctl client command must not load: the daemon's REST API and what it pulls in
_DAEMON = ("kasd.restapi", "kasd.managed", "kasd.asgiport", "kasd.server", "kasd.k8sproxy", "trio")


@pytest.mark.parametrize("module", ["kasctl.env", "kasctl.revoke", "kasctl.kubeconfig"])
def test_a_client_command_imports_no_daemon_internals(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True)
    loaded = json.loads(result.stdout)
    assert [m for m in loaded if m.startswith(_DAEMON)] == []
