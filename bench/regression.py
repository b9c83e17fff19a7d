#!/usr/bin/env python3
"""Requests/s at concurrency 64 through the tunnel, two code trees alternated, daemons and kubesim split.

    python bench/regression.py --old /tmp/base            # this tree vs an older checkout
    python bench/regression.py --old /tmp/base --quick    # fewer rounds and requests

A regression in ``bench/e2e.py``'s tunnel figure may be the daemons' (kasd, agentd) or kubesim's (the
simulated API server behind them). This bench runs the same small GET at concurrency 64, in rounds
that alternate four pairings in one sitting:

  old/old    old daemons, old kubesim      new/new    new daemons, new kubesim
  new/old    new daemons, old kubesim      old/new    old daemons, new kubesim

Each pairing is a fresh demo stack (``kasctl.stack`` of the daemons' tree) started in a child Python
whose ``PYTHONPATH`` puts the daemons' tree first and the kubesim tree's ``kubesim/src`` before it, so
``python -m kubesim`` runs the one and ``python -m kasd``/``agentd`` the other. Besides req/s it reads
each process's CPU time from ``/proc`` around the load and prints the CPU per request of kubesim,
kasd and agentd: the split of a difference between the daemons and kubesim does not depend on how
busy the (shared) machine was, the req/s does.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW = HERE.parent
SMALL = "/api/v1/namespaces/default/configmaps/bench-small"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


#: kasctl.stack's DEMO_CLUSTER_RBAC: what the newer stack gives a kubesim that enforces RBAC for
#: impersonated identities; an older stack (written before kubesim had RBAC) gives it nothing. Its
#: CI job is impersonated with the group gitlab:project:group/demo (the path, not the id): bound too.
DEMO_CLUSTER_RBAC = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: gitlab-demo-project-jobs
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "gitlab:project:1"}
  - {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "gitlab:project:group/demo"}
"""


def _fit_kubesim_args(stack: object, workdir: Path) -> None:
    """Make the daemons' tree's stack start the other tree's kubesim: a kubesim with RBAC gets the demo's
    binding (``--manifest``) even from an older stack; one without RBAC is not given ``--manifest``."""
    import importlib.util

    has_rbac = importlib.util.find_spec("kubesim.rbac") is not None
    original = stack._python  # type: ignore[attr-defined]

    def python(module: str, *args: str) -> list[str]:
        argv = list(args)
        if module == "kubesim":
            if "--manifest" in argv and not has_rbac:
                at = argv.index("--manifest")
                del argv[at : at + 2]
            elif "--manifest" not in argv and has_rbac:
                (workdir / "cluster-rbac.yaml").write_text(DEMO_CLUSTER_RBAC)
                argv += ["--manifest", str(workdir / "cluster-rbac.yaml")]
        result: list[str] = original(module, *argv)
        return result

    stack._python = python  # type: ignore[attr-defined]


def child(requests: int) -> None:
    """Runs with the pairing's PYTHONPATH: one stack, one warm-up, one measured load; prints JSON."""
    import ssl
    import urllib.request

    import trio
    import yaml

    sys.path.insert(0, str(HERE))  # httpload only: kasctl, kasd, kubesim come from PYTHONPATH
    from httpload import run_load

    from kasctl.stack import Stack

    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-regression-")))
    _fit_kubesim_args(stack, stack.dir)
    stack.start()
    try:
        cluster = yaml.safe_load((stack.dir / "cluster.kubeconfig").read_text())["clusters"][0]["cluster"]
        sim_ctx = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        sim_ctx.check_hostname = False
        request = urllib.request.Request(
            cluster["server"] + "/api/v1/namespaces/default/configmaps", method="POST",
            data=json.dumps({"metadata": {"name": "bench-small"}, "data": {"greeting": "hello"}}).encode(),
            headers={"Authorization": f"Bearer {stack.cluster_token}", "Content-Type": "application/json"},
        )  # fmt: skip
        urllib.request.urlopen(request, context=sim_ctx, timeout=60).read()
        kas_ctx = ssl.create_default_context(cadata=stack.ca.cert_pem.bytes().decode())
        kas_ctx.check_hostname = False
        host, port = stack.addresses["kubernetes_api"].rsplit(":", 1)
        headers = [("authorization", f"Bearer {stack.ci_token}"), ("accept", "application/json")]

        def load(count: int) -> float:
            return trio.run(
                lambda: run_load(host, int(port), SMALL, concurrency=64, requests=count, headers=headers, ssl_context=kas_ctx)
            ).rps

        load(max(64, requests // 5))  # warm-up: connections, caches
        pids = {name: p.proc.pid for name, p in (("kubesim", stack.kubesim), ("kasd", stack.kasd), ("agentd", stack.agentd))
                if p is not None and p.proc is not None}  # fmt: skip
        before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        result = trio.run(
            lambda: run_load(host, int(port), SMALL, concurrency=64, requests=requests, headers=headers, ssl_context=kas_ctx)
        )  # fmt: skip
        rps = result.rps
        cpu = {name: (_cpu_seconds(pid) - before[name]) / requests * 1e3 for name, pid in pids.items()}
        print(json.dumps({"rps": rps, "cpu_ms": cpu}), flush=True)
    finally:
        stack.stop()


def run_pairing(daemons: Path, kubesim: Path, requests: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=f"{kubesim / 'kubesim' / 'src'}:{daemons}")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(requests)],
        cwd=daemons, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"pairing daemons={daemons} kubesim={kubesim} failed:\n{out.stderr[-3000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=False, help="a checkout of the older code (git worktree add)")
    parser.add_argument("--new", type=Path, default=NEW, help="the newer checkout (default: this tree)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four pairings (default 3)")
    parser.add_argument("--requests", type=int, default=4000, help="measured requests per pairing (default 4000)")
    parser.add_argument("--quick", action="store_true", help="one round of 600 requests")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    if args.old is None:
        parser.error("--old is required: a checkout of the code to compare with")
    rounds, requests = (1, 600) if args.quick else (args.rounds, args.requests)
    old, new = args.old.resolve(), args.new.resolve()
    pairings = {"old/old": (old, old), "new/new": (new, new), "new/old": (new, old), "old/new": (old, new)}
    results: dict[str, list[dict[str, object]]] = {name: [] for name in pairings}
    print(f"daemons/kubesim pairings, small GET at concurrency 64, {requests} requests, {rounds} rounds")
    print(f"  old = {old}\n  new = {new}")
    for round_ in range(rounds):
        for name, (daemons, kubesim) in pairings.items():
            r = run_pairing(daemons, kubesim, requests)
            results[name].append(r)
            cpu = r["cpu_ms"]
            assert isinstance(cpu, dict)
            print(f"  round {round_ + 1} {name}: {r['rps']:7.0f} req/s   CPU/request ms: "
                  + "  ".join(f"{k} {v:.3f}" for k, v in cpu.items()), flush=True)  # fmt: skip
    print("medians:")
    med: dict[str, dict[str, float]] = {}
    for name, rs in results.items():
        med[name] = {"rps": statistics.median(float(r["rps"]) for r in rs)}  # type: ignore[arg-type]
        for proc in ("kubesim", "kasd", "agentd"):
            med[name][proc] = statistics.median(float(r["cpu_ms"][proc]) for r in rs)  # type: ignore[index]
        m = med[name]
        print(f"  {name}: {m['rps']:7.0f} req/s   kubesim {m['kubesim']:.3f}  kasd {m['kasd']:.3f}  agentd {m['agentd']:.3f} ms CPU/request")
    oo, nn = med["old/old"], med["new/new"]
    print("ratios (req/s ÷ old/old, same run):")
    for name in ("new/new", "new/old", "old/new"):
        print(f"  {name}: {med[name]['rps'] / oo['rps']:.2f}")
    d_daemons = (nn["kasd"] + nn["agentd"]) - (oo["kasd"] + oo["agentd"])
    d_sim = nn["kubesim"] - oo["kubesim"]
    print(f"CPU per request, new - old: daemons {d_daemons * 1e3:+.0f} µs (kasd {(nn['kasd'] - oo['kasd']) * 1e3:+.0f}, "
          f"agentd {(nn['agentd'] - oo['agentd']) * 1e3:+.0f}), kubesim {d_sim * 1e3:+.0f} µs")  # fmt: skip
    print(f"  kubesim's share of the added CPU: {d_sim / (d_sim + d_daemons) * 100 if d_sim + d_daemons else 0:.0f} %")


if __name__ == "__main__":
    main()
