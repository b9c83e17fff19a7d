"""``kasctl notify``: push an event to an agent (``POST /api/v4/agents/<id>/events``, docs/events.md),
or tell kasd its agents' configuration changed in Git (``--config-changed``: ``POST
/api/kasd/v1/config/refresh``) — also as a Git ``post-receive`` hook, whose stdin lines
(``<old> <new> <ref>``) it reads and ignores.

The credential: a personal token (``--token-file`` or ``$KASCTL_TOKEN``, sent as ``PRIVATE-TOKEN``),
else, in a pipeline, the job's ``$CI_JOB_TOKEN`` (sent as ``JOB-TOKEN``): an agent whose ci_access
admits the job accepts its events. Never a flag value (arguments show in ``ps``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from kasctl.envstatus import TOKEN_VARIABLE, rest_token
from kasctl.kubeconfig import API_VARIABLE, CA_VARIABLE, api_url, read_ca
from kasctl.restclient import RestError, rest_call, shown

JOB_TOKEN_VARIABLE = "CI_JOB_TOKEN"
REFRESH_PATH = "/api/kasd/v1/config/refresh"
#: the states an event ends in
ENDED = ("delivered", "failed", "expired")

HELP = f"""\
Push an event to an agent: kasd queues it (in order, per agent) and delivers it to one of the
agent's agentd pods, which acts on it as its configuration says (a webhook to an in-cluster
service, a Flux reconcile annotation; see docs/events.md). Prints the event's id; with --wait,
waits for its delivery and prints its status (exit 0 delivered, 1 failed, expired or still
waiting at --timeout).

  kasctl notify --agent 1 --type push --payload '{{"ref": "main", "url": "https://git.example/app.git"}}'
  kasctl notify --agent 1 --type push --payload-file event.json --id "pipeline-$CI_PIPELINE_ID" --wait

--id makes a retry safe: an id kasd already has for the agent is answered with that event, not
queued again. Tell kasd the agents' configuration changed in Git (it looks for a new commit now):

  kasctl notify --config-changed [--project group/infra]

which works as a Git post-receive hook of the configuration repository too (stdin is read and
ignored): `exec kasctl notify --config-changed` in hooks/post-receive.

Credentials: a personal token from --token-file or ${TOKEN_VARIABLE} (PRIVATE-TOKEN), else the CI
job's ${JOB_TOKEN_VARIABLE} (JOB-TOKEN); --config-changed takes a personal token only (a Developer of
the config project). kasd's API from --api-url or ${API_VARIABLE}; its CA from
--certificate-authority or ${CA_VARIABLE}. kasctl follows no redirect.
"""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    notify = commands.add_parser("notify", help="push an event to an agent, or tell kasd its configuration changed",
                                 description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    notify.add_argument("--agent", metavar="ID", help="the agent's id")
    notify.add_argument("--type", metavar="TYPE", help="the event's type (a-z, 0-9, '.', '_', '-'), e.g. push")
    given = notify.add_mutually_exclusive_group()
    given.add_argument("--payload", metavar="JSON", help="the event's payload, JSON (default null)")
    given.add_argument("--payload-file", metavar="FILE", help="a file holding the payload's JSON ('-': stdin)")
    notify.add_argument("--id", metavar="ID", help="the event's id (default: kasd makes one); a known id is not "
                                                   "queued again")
    notify.add_argument("--wait", action="store_true", help="wait for the event's delivery and print its status")
    notify.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="--wait's bound (default 60)")
    notify.add_argument("--config-changed", action="store_true",
                        help="tell kasd the agents' configuration changed in Git (POST /api/kasd/v1/config/refresh)")
    notify.add_argument("--project", metavar="PATH", help="with --config-changed: the configuration project that "
                                                          "changed (default: all)")
    notify.add_argument("--token-file", metavar="FILE", help=f"file holding your personal token (default "
                                                             f"${TOKEN_VARIABLE}, else ${JOB_TOKEN_VARIABLE})")
    notify.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (default ${API_VARIABLE})")
    notify.add_argument("--certificate-authority", metavar="FILE",
                        help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")
    notify.add_argument("--json", action="store_true", help="print kasd's answer as JSON")


Call = Callable[..., dict[str, Any]]


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None, *, call: Call = rest_call,
        stdin: IO[str] | None = None, out: IO[str] | None = None, sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic) -> int:
    env = dict(environ if environ is not None else os.environ)
    out = out or sys.stdout
    try:
        if args.config_changed:
            return _config_changed(args, env, call, stdin or sys.stdin, out)
        return _notify(args, env, call, out, sleep, clock)
    except RestError as exc:
        print(f"kasctl notify: {exc}", file=sys.stderr)
        return exc.code


def credentials(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, str]:
    """(token, header): a personal token, else the CI job's token; RestError(2) when neither."""
    header, token = rest_token(args.token_file, env, job=True)
    return token, header


def _config_changed(args: argparse.Namespace, env: dict[str, str], call: Call, stdin: IO[str], out: IO[str]) -> int:
    if args.agent or args.type or args.payload is not None or args.payload_file or args.id or args.wait:
        raise RestError("--config-changed takes only --project (and the connection's options)", 2)
    if not stdin.isatty():
        for _line in stdin:  # a post-receive hook's "<old> <new> <ref>" lines: read, so git never blocks on them
            pass
    # kasd's refresh takes a personal token (a Developer of the config project), never a job's
    header, token = rest_token(args.token_file, env)
    api = api_url(args, env)
    answer = call(api, REFRESH_PATH, token, read_ca(args.certificate_authority or env.get(CA_VARIABLE)),
                  method="POST", body={"project": args.project}, token_header=header)
    print(json.dumps(answer) if args.json else f"kasd asked to look for a new configuration commit"
          f"{' of ' + args.project if args.project else ''}", file=out)
    return 0


def _payload(args: argparse.Namespace) -> Any:
    if args.payload_file:
        try:
            text = sys.stdin.read() if args.payload_file == "-" else Path(args.payload_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise RestError(f"cannot read --payload-file {args.payload_file}: {exc}", 2) from None
        what = "--payload-file"
    elif args.payload is not None:
        text, what = args.payload, "--payload"
    else:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RestError(f"{what} is not JSON: {exc}", 2) from None


def _notify(args: argparse.Namespace, env: dict[str, str], call: Call, out: IO[str],
            sleep: Callable[[float], None], clock: Callable[[], float]) -> int:
    if not args.agent or not args.type:
        raise RestError("pass --agent ID and --type TYPE (or --config-changed)", 2)
    if not (args.agent.isascii() and args.agent.isdigit() and len(args.agent) <= 19):
        raise RestError(f"--agent must be an agent's id (digits), not {args.agent[:40]!r}", 2)
    body: dict[str, Any] = {"type": args.type, "payload": _payload(args)}
    if args.id:
        body["id"] = args.id
    token, header = credentials(args, env)
    api = api_url(args, env)
    ca_pem = read_ca(args.certificate_authority or env.get(CA_VARIABLE))
    event = call(api, f"/api/v4/agents/{args.agent}/events", token, ca_pem, method="POST", body=body,
                 token_header=header)
    if not args.wait:
        print(json.dumps(event) if args.json else event.get("id"), file=out)
        return 0
    path = f"/api/v4/agents/{args.agent}/events/{quote(str(event.get('id')), safe='')}"
    deadline, pause = clock() + args.timeout, 0.05
    while event.get("state") not in ENDED and clock() < deadline:
        sleep(min(pause, max(0.0, deadline - clock())))
        pause = min(pause * 2, 1.0)
        event = call(api, path, token, ca_pem, token_header=header)
    if args.json:
        print(json.dumps(event), file=out)
    else:
        print(shown(f"{event.get('id')} {event.get('state')} outcome={event.get('outcome') or '-'} "
                    f"attempts={event.get('attempts')} pod={event.get('pod') or '-'}"
                    + (f" detail={event.get('detail')}" if event.get("detail") else "")), file=out)
    return 0 if event.get("state") == "delivered" else 1


__all__ = ["HELP", "REFRESH_PATH", "add_command", "credentials", "run"]
