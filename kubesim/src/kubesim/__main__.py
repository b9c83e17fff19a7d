"""`python -m kubesim` (or `kubesim`): run the simulated API server for a demo or by hand.

Examples:

    # plain HTTP on 127.0.0.1:6443, any request accepted
    python -m kubesim --port 6443

    # TLS with a bearer token, and a kubeconfig kubectl can use at once
    python -m kubesim --port 6443 --token s3cret --self-signed --kubeconfig-out ./kubeconfig

    # the same, with the token kept out of `ps`
    python -m kubesim --port 6443 --token-file ./cluster-token --self-signed --kubeconfig-out ./kubeconfig
    KUBECONFIG=./kubeconfig kubectl get pods -A
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import trio
import yaml

from kubesim.errors import ApiError
from kubesim.requests import RecordedRequest
from kubesim.server import KubeSim, serve_kubesim

EPILOG = """\
kubectl only sends a bearer token over TLS, so use --self-signed (or --tls-cert/--tls-key) with
--token or --token-file when kubectl is the client. The written kubeconfig trusts the certificate
it was made with; with your own certificate pass --tls-ca so the kubeconfig can carry it.

Knobs: annotate a pod (or a pod template) with
  kubesim.io/crash-loop: "true"     the container keeps crashing (CrashLoopBackOff)
  kubesim.io/stall-rollout: "true"  pods never become Ready, so a rollout stalls
  kubesim.io/fail: "true"           a Job's pod exits with code 1
See docs/kubesim.md for what is served and what is not.

Log lines go to stderr as JSON objects, one per line. SIGTERM or Ctrl-C shuts down cleanly.
"""


def log(event: str, **fields: Any) -> None:
    record = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, **fields}
    print(json.dumps(record), file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kubesim", description="A simulated Kubernetes API server that kubectl and client "
        "libraries cannot tell from a real cluster (for tests and demos).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=6443, help="port to listen on; 0 picks a free one (default: 6443)")
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument("--token", help="bearer token every request must carry (default: none needed); "
                        "visible in ps: prefer --token-file")
    tokens.add_argument("--token-file", type=Path, metavar="PATH",
                        help="read that token from this file (one line; a trailing newline is ignored)")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain to serve TLS with")
    parser.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    parser.add_argument("--tls-ca", type=Path, help="PEM CA certificate to put in --kubeconfig-out")
    parser.add_argument("--self-signed", action="store_true",
                        help="serve TLS with a fresh throw-away CA (needs the trustme package)")
    parser.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig for this server here")
    parser.add_argument("--manifest", type=Path, action="append", default=[], metavar="PATH",
                        help="YAML objects to create at start (repeatable), as a cluster's add-on "
                        "manifests: e.g. the ClusterRoleBindings impersonated users need, since "
                        "kubesim enforces RBAC for every identity but its own token's")
    parser.add_argument("--log-requests", action="store_true", help="log one line per request served")
    parser.add_argument("--server-version", default="v1.32.0", help="version /version reports (default: v1.32.0)")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.self_signed and args.tls_cert:
        parser.error("--self-signed and --tls-cert exclude each other")
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().rstrip("\r\n")
        except OSError as exc:
            parser.error(f"--token-file: cannot read {args.token_file}: {exc.strerror or exc}")
        if not token.strip():
            parser.error(f"--token-file: {args.token_file} is empty")
        args.token = token
    args.objects = []
    for path in args.manifest:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except OSError as exc:
            parser.error(f"--manifest: cannot read {path}: {exc.strerror or exc}")
        except yaml.YAMLError as exc:
            parser.error(f"--manifest: {path} is not YAML: {exc}")
        for number, doc in enumerate(docs, 1):
            if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
                parser.error(f"--manifest: {path}: document {number} is not an object with "
                             "apiVersion and kind")
            args.objects.append((path, number, doc))
    return args


def tls_context(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, bytes | None]:
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        return context, args.tls_ca.read_bytes() if args.tls_ca else None
    if args.self_signed:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost", args.host)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        return context, ca.cert_pem.bytes()
    return None, None


def log_request(request: RecordedRequest) -> None:
    fields: dict[str, Any] = {"method": request.method, "path": request.path}
    if request.query:
        fields["query"] = request.query
    if request.impersonate:
        fields["impersonate"] = dict(request.impersonate)
    fields["user_agent"] = request.user_agent
    log("request", **fields)


async def run(args: argparse.Namespace) -> None:
    from kubesim.app import ServerVersion
    from kubesim.store import Store

    context, ca_pem = tls_context(args)
    version_text = args.server_version.lstrip("v")
    major, minor = [*version_text.split("."), "0"][:2]
    version = ServerVersion(major=major, minor=minor, git_version=f"v{version_text}")
    store = Store()
    for path, number, doc in args.objects:  # before listening: a refused object stops the start
        try:
            store.create_objects([doc])
        except ApiError as exc:
            raise ApiError(exc.code, exc.reason, f"{path}: document {number}: {exc.message}") from None
    async with trio.open_nursery() as nursery:
        sim: KubeSim = await nursery.start(lambda task_status: serve_kubesim(
            host=args.host, port=args.port, token=args.token, tls=context, ca_pem=ca_pem,
            version=version, on_request=log_request if args.log_requests else None,
            store=store, task_status=task_status))
        log("listening", url=sim.url, tls=sim.tls, token_required=args.token is not None)
        if args.token is not None and not sim.tls:
            log("warning", message="kubectl sends bearer tokens only over TLS, so it will get 401 "
                "here; add --self-signed (or --tls-cert/--tls-key)")
        if args.kubeconfig_out:
            path = sim.write_kubeconfig(args.kubeconfig_out)
            log("kubeconfig_written", path=str(path))
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log("shutting_down", signal=signal.Signals(signum).name, requests=len(sim.requests))
                sim.stop()
                break
    log("stopped")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        trio.run(run, args)
    except OSError as exc:
        log("error", message=str(exc))
        return 1
    except ApiError as exc:  # a --manifest object the cluster refuses
        print(f"kubesim: error: --manifest: {exc.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
