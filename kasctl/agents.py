"""``kasctl agents``: every connected agentd pod of the agents you may see, with its identity and
topology — one row per tunnel: agent, pod, its namespace and node, the namespaces it serves, the kasd
replica holding the tunnel, agentd's version and since when. Asks ``GET /api/kasd/v1/agents`` (every
replica's tunnels, whichever replica answers) with a personal token, as ``kasctl env list`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from kasctl.envstatus import TOKEN_VARIABLE, EnvClient, client_of
from kasctl.kubeconfig import API_VARIABLE, CA_VARIABLE
from kasctl.restclient import RestError, shown

HELP = f"""\
List the agents you may see and every agentd pod connected to each (one row per tunnel: a pod
keeps several, often on different kasd replicas): the pod, its namespace and node, the namespaces
it serves ("*": the whole cluster), the replica holding the tunnel, agentd's version, since when.
An agent with no pod connected shows one row with "-".

  export {TOKEN_VARIABLE}="$(kasctl token pat alice --ttl 8h ...)"   # or --token-file FILE
  kasctl agents --api-url https://kasd.example:8153
  kasctl agents --agent 1 -o json

Asks GET /api/kasd/v1/agents. The API from --api-url or ${API_VARIABLE}.
"""

COLUMNS = ("AGENT", "POD", "NAMESPACE", "NODE", "SERVES", "REPLICA", "VERSION", "SINCE")


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = commands.add_parser("agents", help="connected agentd pods: namespace, node, replica", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("--agent", metavar="ID", type=int, help="only this agent")
    cmd.add_argument("-o", "--output", choices=("table", "json"), default="table", help="table (default) or json")
    cmd.add_argument("--token-file", metavar="FILE", help=f"file holding your personal token (default ${TOKEN_VARIABLE})")
    cmd.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (default ${API_VARIABLE})")
    cmd.add_argument("--certificate-authority", metavar="FILE",
                     help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")


def run(args: argparse.Namespace, client: EnvClient | None = None, out: TextIO = sys.stdout) -> int:
    try:
        client = client or client_of(args, os.environ)
        agents = client.get("/api/kasd/v1/agents")
    except RestError as exc:
        print(f"kasctl agents: {exc}", file=sys.stderr)
        return exc.code
    if not isinstance(agents, list):
        print("kasctl agents: kasd's answer is not a list of agents", file=sys.stderr)
        return 1
    if args.agent is not None:
        agents = [a for a in agents if isinstance(a, dict) and a.get("id") == args.agent]
    if args.output == "json":
        print(json.dumps(agents, indent=2), file=out)
    else:
        print(table(agents), end="", file=out)
    return 0


def _text(value: Any) -> str:
    return "-" if value in (None, "") else shown(value)


def rows(agents: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for agent in agents:
        name = shown(f"{agent.get('id')} ({agent.get('name')})")
        connections = agent.get("connections") or []
        if not connections:
            found.append((name, *("-" * len(COLUMNS[1:]))))
        for c in connections:
            served = c.get("namespaces")
            serves = "-" if served is None else shown(",".join(map(str, served))) or "*"
            found.append((name, _text(c.get("pod")), _text(c.get("pod_namespace")), _text(c.get("node")), serves,
                          _text(c.get("replica")), _text(c.get("version")), _text(c.get("since"))))
    return found


def table(agents: Sequence[Mapping[str, Any]]) -> str:
    lines = [COLUMNS, *rows(agents)]
    widths = [max(len(r[i]) for r in lines) for i in range(len(COLUMNS))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in lines)


__all__ = ["add_command", "rows", "run", "table"]
