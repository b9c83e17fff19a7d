"""``kasctl env list`` and ``kasctl env status``: a project's environments with their health, and
one environment's objects as a tree with each one's health — what the dashboard shows, in a
terminal. They ask kasd's REST API (``listeners.api``) with a personal token (``kasctl token pat``),
read from ``--token-file`` or ``$KASCTL_TOKEN`` (never a flag value: arguments show in ``ps``).

``status`` exits 1 when the environment is Degraded, 0 otherwise, so a script can gate on it;
``--wait`` follows the live graph (``/resources/watch``, server-sent events) until it is Healthy,
printing a progress line, and exits 1 at ``--timeout`` saying what is still not healthy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO
from urllib.parse import quote, urlencode

from kasctl.kubeconfig import API_VARIABLE, CA_VARIABLE, api_url, read_ca
from kasctl.kubeconfig import TOKEN_VARIABLE as JOB_TOKEN_VARIABLE
from kasctl.restclient import RestError, rest_events, rest_json, shown

TOKEN_VARIABLE = "KASCTL_TOKEN"
#: seconds a read of the event stream may wait (kasd sends a comment every 15 s)
READ_TIMEOUT = 20.0
#: most environments ``list`` shows (GitLab's largest page)
MAX_LIST = 100

COLOURS = {"Healthy": "32", "Progressing": "34", "Degraded": "31", "Suspended": "35", "Missing": "33",
           "Unknown": "90"}

LIST_HELP = f"""\
List a project's environments with their health: name, tier, state, health (the roll-up of its
objects, as seen through its agent's user_access) and the last deployment.

  export {TOKEN_VARIABLE}="$(kasctl token pat alice --ttl 8h ...)"   # or --token-file FILE
  kasctl env list --project group/app --api-url https://kasd.example:8153
  kasctl env list --project group/app -o json

Asks GET /api/v4/projects/:project/environments (GitLab's) and /api/kasd/v1/environments/:id.
"""

STATUS_HELP = f"""\
Show one environment's objects as a tree (what owns what: Deployment → ReplicaSet → Pod …), each
with its health (Healthy, Progressing, Degraded, Suspended, Missing, Unknown — Argo CD's words),
and the environment's roll-up on top.

  kasctl env status --project group/app --environment production
  kasctl env status --project group/app --environment review/feat-x -o json
  kasctl env status --project group/app --environment production --wait --timeout 5m

Exit status: 1 when the environment is Degraded (or, with --wait, not Healthy by --timeout), 0
otherwise; 2 for a wrong command line. --wait follows kasd's live graph and prints one progress
line per change until every object is Healthy. The personal token comes from --token-file or
${TOKEN_VARIABLE}; the API from --api-url or ${API_VARIABLE}. Colours only when stdout is a terminal.
"""


class EnvClient(Protocol):
    """kasd's REST API as these commands use it (tests give a fake)."""

    def get(self, path: str) -> Any: ...

    def events(self, path: str) -> Iterator[tuple[str, str]]: ...


class RestEnvClient:
    def __init__(self, api: str, token: str, ca_pem: bytes | None) -> None:
        self.api, self._token, self.ca_pem = api, token, ca_pem

    def get(self, path: str) -> Any:
        return rest_json(self.api, path, self._token, self.ca_pem, token_header="PRIVATE-TOKEN")

    def events(self, path: str) -> Iterator[tuple[str, str]]:
        return rest_events(self.api, path, self._token, self.ca_pem, read_timeout=READ_TIMEOUT)


def add_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, help_text, description in (("list", "a project's environments with their health", LIST_HELP),
                                         ("status", "one environment's objects as a tree, with health", STATUS_HELP)):
        cmd = actions.add_parser(name, help=help_text, description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.add_argument("--project", metavar="PATH", required=True, help="the project's full path or id")
        if name == "status":
            cmd.add_argument("--environment", metavar="NAME", required=True, help="the environment's name")
            cmd.add_argument("--wait", action="store_true", help="wait until it is Healthy (see --timeout)")
            cmd.add_argument("--timeout", metavar="DURATION", default="5m", type=duration,
                             help="how long --wait waits: 90s, 5m, 1h (default 5m)")
        cmd.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")
        cmd.add_argument("--token-file", metavar="FILE", help=f"file holding your personal token (default ${TOKEN_VARIABLE})")
        cmd.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (default ${API_VARIABLE})")
        cmd.add_argument("--certificate-authority", metavar="FILE",
                         help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")
        cmd.set_defaults(run=run_list if name == "list" else run_status)


def duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (90s, 5m, 1h): {text!r}") from None
    if not 0 < value <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 24h: {text!r}")
    return value


def rest_token(token_file: str | None, environ: Mapping[str, str], *, job: bool = False) -> tuple[str, str]:
    """(header, token) for kasd's API: a personal token (``--token-file``, else ``$KASCTL_TOKEN``) as
    ``PRIVATE-TOKEN``; with ``job``, else the CI job's (``$CI_JOB_TOKEN``) as ``JOB-TOKEN``.
    ``RestError`` (exit 2) saying what to set when there is none."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise RestError(f"cannot read --token-file {token_file}: {exc.strerror or exc}", 2) from None
        if token:
            return "PRIVATE-TOKEN", token
    elif token := environ.get(TOKEN_VARIABLE, "").strip():
        return "PRIVATE-TOKEN", token
    if job and (token := environ.get(JOB_TOKEN_VARIABLE, "").strip()):
        return "JOB-TOKEN", token
    if job:
        raise RestError(f"missing token: set {TOKEN_VARIABLE} (a personal token), pass --token-file, or run in a "
                        f"CI job (${JOB_TOKEN_VARIABLE})", 2)
    raise RestError(f"missing personal token: set {TOKEN_VARIABLE} or pass --token-file", 2)


def client_of(args: argparse.Namespace, environ: Mapping[str, str]) -> RestEnvClient:
    _, token = rest_token(args.token_file, environ)
    env = dict(environ)
    return RestEnvClient(api_url(args, env), token, read_ca(args.certificate_authority or env.get(CA_VARIABLE)))


def run_list(args: argparse.Namespace, client: EnvClient | None = None, out: TextIO = sys.stdout) -> int:
    try:
        client = client or client_of(args, os.environ)
        rows = list_environments(client, args.project)
    except RestError as exc:
        print(f"kasctl env list: {exc}", file=sys.stderr)
        return exc.code
    if args.output == "json":
        print(json.dumps(rows, indent=2), file=out)
        return 0
    colour = out.isatty()
    table: list[tuple[str, ...]] = [("NAME", "TIER", "STATE", "HEALTH", "LAST DEPLOYED")]
    for row in rows:
        deployed = row.get("last_deployment") or {}
        table.append(tuple(map(shown, (row["name"], row.get("tier") or "-", row["state"], row["health"]["status"],
                                       deployed.get("at") or "-"))))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for n, r in enumerate(table):
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        if n and colour:
            cells[3] = paint(r[3], cells[3])
        print("  ".join(cells).rstrip(), file=out)
    if not rows:
        print(f"(no environments in {args.project})", file=out)
    return 0


def list_environments(client: EnvClient, project: str) -> list[dict[str, Any]]:
    envs = client.get(f"/api/v4/projects/{quote(project, safe='')}/environments?per_page={MAX_LIST}")
    rows = []
    for env in envs:
        try:
            answer = client.get(f"/api/kasd/v1/environments/{int(env['id'])}")
            health = answer.get("health") or {"status": "Unknown", "message": ""}
            last = (answer.get("environment") or {}).get("last_deployment")
        except RestError as exc:  # (its agent's user_access may refuse this user: say so, go on)
            health, last = {"status": "Unknown", "message": str(exc)}, None
        rows.append({"id": env["id"], "name": env["name"], "tier": env.get("tier"), "state": env.get("state"),
                     "health": health, "last_deployment": last})
    return rows


def find_environment(client: EnvClient, project: str, name: str) -> dict[str, Any]:
    found = client.get(f"/api/v4/projects/{quote(project, safe='')}/environments?{urlencode({'name': name})}")
    if not found:
        raise RestError(f"no environment {name!r} in project {project} (kasctl env list --project {project})")
    return dict(found[0])


def run_status(args: argparse.Namespace, client: EnvClient | None = None, out: TextIO = sys.stdout,
               err: TextIO = sys.stderr, clock: Callable[[], float] = time.monotonic) -> int:
    try:
        client = client or client_of(args, os.environ)
        env = find_environment(client, args.project, args.environment)
        if args.wait:
            return wait_healthy(client, env, args, out, err, clock)
        answer = client.get(f"/api/kasd/v1/environments/{int(env['id'])}/resources")
    except RestError as exc:
        print(f"kasctl env status: {exc}", file=err)
        return exc.code
    show(answer, args.output, out)
    return 1 if answer["graph"]["health"]["status"] == "Degraded" else 0


def show(answer: Mapping[str, Any], output: str, out: TextIO) -> None:
    if output == "json":
        print(json.dumps(answer, indent=2), file=out)
        return
    colour = out.isatty()
    env, graph = answer.get("environment") or {}, answer["graph"]
    health = graph["health"]
    status = paint(health["status"], shown(health["status"])) if colour else shown(health["status"])
    print(shown(f"{env.get('name', '?')} ({env.get('project', '?')}): ") + status
          + (shown(f" — {health['message']}") if health.get("message") else ""), file=out)
    for line in tree_text(graph, colour):
        print(line, file=out)
    for problem in answer.get("problems") or ():
        print(shown(f"! {problem['kind']} in {problem['namespace'] or '(cluster)'}: {problem['reason']}: "
                    f"{problem['message']}"), file=out)
    if answer.get("hint"):
        print(shown(f"hint: {answer['hint']}"), file=out)


def tree_lines(graph: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(prefix, node) for each node of the ``owns`` forest, depth first, roots in the graph's order,
    children by id: ``kasd.envgraph.tree_lines``' walk, over the graph's JSON (what kasctl gets;
    ``tree_lines`` takes a ``Graph``). A node met twice (bad data) is shown once."""
    nodes = {n["id"]: n for n in graph.get("nodes") or ()}
    children: dict[str, list[str]] = {}
    for edge in graph.get("edges") or ():
        if edge.get("relation") == "owns" and edge["source"] in nodes and edge["target"] in nodes:
            children.setdefault(edge["source"], []).append(edge["target"])
    lines: list[tuple[str, Mapping[str, Any]]] = []
    seen: set[str] = set()

    def walk(node_id: str, lead: str, last: bool, depth: int) -> None:
        if node_id in seen:
            return
        seen.add(node_id)
        lines.append((lead + (("└─ " if last else "├─ ") if depth else ""), nodes[node_id]))
        kids = sorted(children.get(node_id, ()))
        for i, kid in enumerate(kids):
            walk(kid, lead + (("   " if last else "│  ") if depth else ""), i == len(kids) - 1, depth + 1)

    for root in graph.get("roots") or sorted(nodes):
        if root in nodes:
            walk(root, "", True, 0)
    return lines


def tree_text(graph: Mapping[str, Any], colour: bool) -> list[str]:
    rows = [(prefix + shown(f"{n['kind']} {n['namespace'] + '/' if n.get('namespace') else ''}{n['name']}"),
             shown(n["health"]["status"]), shown(n["health"].get("message") or "")) for prefix, n in tree_lines(graph)]
    width = max((len(r[0]) for r in rows), default=0)
    out = []
    for label, status, message in rows:
        cell = paint(status, status.ljust(11)) if colour else status.ljust(11)
        out.append(f"{label.ljust(width)}  {cell}  {message}".rstrip())
    return out


def paint(status: str, text: str) -> str:
    return f"\x1b[{COLOURS.get(status, '0')}m{text}\x1b[0m"


def wait_healthy(client: EnvClient, env: Mapping[str, Any], args: argparse.Namespace, out: TextIO, err: TextIO,
                 clock: Callable[[], float]) -> int:
    """Follow the live graph until Healthy (0) or ``--timeout`` (1, naming what is not healthy)."""
    deadline = clock() + args.timeout
    started = clock()
    graph: Mapping[str, Any] | None = None
    path = f"/api/kasd/v1/environments/{int(env['id'])}/resources/watch"
    last_line = ""
    while clock() < deadline:
        try:
            for event, data in client.events(path):
                if event == "graph":
                    graph = json.loads(data)
                    assert graph is not None
                    health = graph["health"]
                    if health["status"] == "Healthy":
                        show({"environment": {"name": env["name"], "project": args.project}, "graph": graph},
                             args.output, out)
                        return 0
                    line = shown(f"waiting for {env['name']}: {health['status']}"
                                 + (f" — {health['message']}" if health.get("message") else "")) + \
                        f" ({clock() - started:.0f}s)"
                    if line != last_line:
                        print(line, file=err, flush=True)
                        last_line = line
                elif event == "end":  # kasd dropped this stream (too slow): follow it again
                    break
                if clock() >= deadline:
                    break
        except RestError as exc:
            if exc.code == 2 or "refused" in str(exc) or graph is None:
                raise
            print(f"kasctl env status: {exc}; following again", file=err)
            time.sleep(min(1.0, max(0.0, deadline - clock())))  # (a command line: no reconnect storm)
    if graph is None:
        print(f"kasctl env status: {shown(env['name'])} did not report its objects within {args.timeout:g} s", file=err)
        return 1
    bad = [n for n in graph.get("nodes") or () if n["health"]["status"] != "Healthy"]
    print(f"kasctl env status: {shown(env['name'])} is not Healthy after {args.timeout:g} s "
          f"({shown(graph['health']['status'])}); not healthy:", file=err)
    for n in bad:
        print(shown(f"  {n['id']}: {n['health']['status']}" + (f" — {n['health']['message']}" if n["health"].get("message")
                                                               else "")), file=err)
    show({"environment": {"name": env["name"], "project": args.project}, "graph": graph}, args.output, out)
    return 1
