#!/usr/bin/env python3
"""Which product files one ``kubectl get pods`` really runs through, counted, not drawn.

    . .venv/bin/activate && PYTHONPATH=$PWD python scripts/request_path.py [--warm]

It starts kubesim, a real kasd (TLS proxy port) and a real agentd in one Trio thread (the test
harness ``tests/kubesim/kubectl_harness.py``, so kubesim must be installed, as ``scripts/venv.sh``
does), then runs ``kubectl get --raw /api/v1/namespaces/default/pods`` (one request, no discovery; HTTP/2 by
ALPN; ``--http1`` sends it with urllib over HTTP/1.1 instead) on a new connection with a CI job
token (``ci:<agent id>:<job token>``) and records, with ``sys.setprofile`` in that thread, every function
of a product package called from the accept to the last byte: the proxy port's accept, the front end,
the pipeline, the router, the tunnel, agentd and its upstream, and back. ``--warm`` sends the same
request twice first, so the job's grant is already cached (the path of every request but a token's
first). It prints each file with the functions it ran and the count per package; a background
ping of the tunnel may add ``wire`` functions, never a file off the path. ``docs/architecture.md``
quotes its count.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.import_graph import PRODUCT  # noqa: E402  (after the path is set)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--warm", action="store_true", help="send the request twice before tracing it")
    parser.add_argument("--http1", action="store_true",
                        help="send it over HTTP/1.1 (urllib) instead of kubectl's HTTP/2")
    args = parser.parse_args(argv)

    from tests.kubesim.kubectl_harness import JOB_TOKEN, TUNNEL_AGENT_ID, ServerThread

    with tempfile.TemporaryDirectory() as workdir:
        server = ServerThread(Path(workdir), route="tunnel").start()
        try:
            url = json.loads(server.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
            context = ssl.create_default_context(cafile=str(server.ca_path))

            def get() -> int:
                if not args.http1:
                    done = subprocess.run(
                        [shutil.which("kubectl") or "kubectl", "get", "--raw", "/api/v1/namespaces/default/pods"],
                        env=server.env(), capture_output=True, timeout=15, check=False)
                    if done.returncode:
                        raise SystemExit(f"kubectl failed: {done.stderr.decode()}")
                    return 200
                request = urllib.request.Request(
                    url + "/api/v1/namespaces/default/pods",
                    headers={"Authorization": f"Bearer ci:{TUNNEL_AGENT_ID}:{JOB_TOKEN}"})
                with urllib.request.urlopen(request, context=context, timeout=10) as response:
                    response.read()
                    return int(response.status)

            if args.warm:
                get(), get()
            ran: dict[str, set[str]] = collections.defaultdict(set)

            def profile(frame: FrameType, event: str, arg: Any) -> None:
                if event != "call":
                    return
                code = frame.f_code
                name = code.co_filename
                if name.startswith("<attrs generated methods "):  # an attrs class made: its module
                    module = name.removeprefix("<attrs generated methods ").rstrip(">").rpartition(".")[0]
                    name = str(ROOT / (module.replace(".", "/") + ".py"))
                path = Path(name)
                if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in PRODUCT:
                    ran[str(path.relative_to(ROOT))].add(code.co_qualname)

            server.call(sys.setprofile, profile)
            try:
                status = get()
            finally:
                server.call(sys.setprofile, None)
        finally:
            server.stop()

    client = "HTTP/1.1" if args.http1 else "kubectl, HTTP/2"
    grant = "a cached grant" if args.warm else "the token first seen"
    print(f"GET /api/v1/namespaces/default/pods ({client}, {grant}) → {status}")
    per_package: collections.Counter[str] = collections.Counter()
    for name in sorted(ran):
        per_package[name.split("/")[0]] += 1
        print(f"  {name}: {', '.join(sorted(ran[name]))}")
    print(f"{len(ran)} files: " + ", ".join(f"{p} {per_package[p]}" for p in PRODUCT if per_package[p]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
