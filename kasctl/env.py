"""``kasctl env stop``: stop a CI environment — kasd deletes what it created for it (its managed
namespace and the template's other objects) on every agent the job may use, per the template's
``delete_resources``, and never anything it did not create.

It is the call a GitLab stop job makes (``environment: {name: review/$CI_COMMIT_REF_SLUG, action:
stop}``), so it takes the stop job's own token: ``POST
/api/v4/projects/<project>/environments/<name>/stop`` with a ``Job-Token`` header. Project and
environment default to the job's ``CI_PROJECT_PATH`` and ``CI_ENVIRONMENT_NAME``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from kasctl import envstatus
from kasctl.kubeconfig import API_VARIABLE, CA_VARIABLE, TOKEN_VARIABLE, api_url, read_ca, setting
from kasctl.restclient import RestError, rest_call, shown
from kasd.restpaths import STOP_PATH, stop_path

HELP = f"""\
Stop a CI environment: kasd deletes what it created for it (the managed namespace and the
template's other objects, per delete_resources) through each agent the job may use, and keeps
anything it did not create. Calls kasd's REST API (POST {STOP_PATH})
with the stop job's token, which must be a job of that project in that environment.

In a GitLab stop job (environment: {{name: review/$CI_COMMIT_REF_SLUG, action: stop}}):
  kasctl env stop                          # CI_JOB_TOKEN, CI_PROJECT_PATH, CI_ENVIRONMENT_NAME, {API_VARIABLE}

By hand:
  kasctl env stop --project group/app --environment review/feat-x --job-token "$(kasctl token ci ...)"

Prints what was deleted, kept (not made by kasd) and already gone, per agent; --json for kasd's answer.
kasctl follows no redirect: the token goes to --api-url and nowhere else.
"""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    env = commands.add_parser("env", help="CI environments: list them, show one's health, stop one",
                              description="CI environments: list a project's (kasctl env list), show one's objects "
                                          "and health (kasctl env status), stop one (kasctl env stop).")
    actions = env.add_subparsers(dest="env_command", required=True, metavar="ACTION")
    envstatus.add_commands(actions)
    stop = actions.add_parser("stop", help="delete what kasd created for an environment", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    stop.add_argument("--project", metavar="PATH", help="the project's full path or id (default $CI_PROJECT_PATH)")
    stop.add_argument("--environment", metavar="NAME", help="the environment's name (default $CI_ENVIRONMENT_NAME)")
    stop.add_argument("--job-token", metavar="TOKEN",
                      help=f"the stop job's token (default ${TOKEN_VARIABLE}); prefer the variable: arguments show in ps")
    stop.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (default ${API_VARIABLE})")
    stop.add_argument("--certificate-authority", metavar="FILE",
                      help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")
    stop.add_argument("--json", action="store_true", help="print kasd's answer as JSON")
    stop.set_defaults(run=run)


def dispatch(args: argparse.Namespace) -> int:
    """The chosen action's ``run``."""
    action: Callable[[argparse.Namespace], int] = args.run
    return action(args)


def run(args: argparse.Namespace) -> int:
    try:
        answer = stop(args, os.environ)
    except RestError as exc:
        print(f"kasctl env stop: {exc}", file=sys.stderr)
        return exc.code
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(report(answer), end="")
    return 0


def stop(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    project = setting(args.project, environ, "CI_PROJECT_PATH", "--project")
    environment = setting(args.environment, environ, "CI_ENVIRONMENT_NAME", "--environment")
    token = setting(args.job_token, environ, TOKEN_VARIABLE, "--job-token")
    api = api_url(args, environ)
    ca_pem = read_ca(args.certificate_authority or environ.get(CA_VARIABLE))
    return rest_call(api, stop_path(project, environment), token, ca_pem, method="POST")


def report(answer: dict[str, Any]) -> str:
    lines = [f"environment {answer.get('environment')!r} of {answer.get('project')} stopped"]
    agents = answer.get("agents") or []
    if not agents:
        lines.append("  kasd manages nothing for it on any agent this job may use")
    for agent in agents:
        lines.append(f"  agent {agent['id']} (namespace {agent.get('namespace') or '-'}, "
                     f"delete_resources: {agent.get('delete_resources')}):")
        for word in ("deleted", "kept", "absent"):
            for item in agent.get(word) or []:
                note = {"kept": "  (not made by kasd, or delete_resources: never)", "absent": "  (already gone)"}.get(word, "")
                lines.append(f"    {word:8} {item}{note}")
    return "\n".join(map(shown, lines)) + "\n"  # (names an agent answered: escaped, never sent raw)
