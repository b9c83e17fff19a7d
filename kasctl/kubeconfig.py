"""``kasctl kubeconfig --job-token T``: a CI job's kubeconfig, one context per agent it may use.

It asks kasd's REST API (``GET /api/v4/job/allowed_agents`` with a ``Job-Token`` header, the call
GitLab's own kubeconfig generation makes) and writes what GitLab writes for a job — one cluster (the
Kubernetes API proxy, with its CA), one user per agent (``agent:<id>``, token ``ci:<id>:<job token>``)
and one context per agent named ``<config project path>:<agent name>`` — and, unlike GitLab (their
issue 521125), each context selects the namespace the job works in: its managed namespace (which kasd
creates on the job's first request), else a ``rules:`` namespace, else the entry's
``default_namespace``. Agents the job may not use are not there at all.

The kubeconfig holds the job token: it goes to stdout (for ``> "$KUBECONFIG"``) or, with
``--output``, to a new file readable by its owner only. Errors are one line on stderr, exit 1 (kasd
unreachable or refusing) or 2 (a wrong command line), and never quote the token. The call goes
through ``kasctl.restclient``, which follows no redirect (the token goes to ``--api-url`` only).

A job no agent allows is an error too (exit 1, nothing on stdout, no ``--output`` file): GitLab's
API answers it an empty ``allowed_agents`` list, as kasd's does, and GitLab then gives the job no
kubeconfig at all; a kubeconfig without contexts, exit 0, would only make the job's first kubectl
fail far from the reason.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from kasctl.restclient import RestError, rest_call, shown
from kasd.restpaths import ALLOWED_AGENTS_PATH
from wire.ids import InvalidNumber, check_id

TOKEN_VARIABLE = "CI_JOB_TOKEN"
API_VARIABLE = "KASCTL_API_URL"
SERVER_VARIABLE = "KASCTL_PROXY_URL"
CA_VARIABLE = "KASCTL_CA_FILE"
CLUSTER = "kasd"

HELP = f"""\
Print a CI job's kubeconfig: one context per agent the job may use, named
<config project path>:<agent name>, each with the job's token (ci:<agent id>:<job token>) and the
namespace the job works in. Asks kasd's REST API (GET {ALLOWED_AGENTS_PATH}, listeners.api);
it follows no redirect, so the job token goes to --api-url and nowhere else.

In a CI job:
  kasctl kubeconfig > "$KUBECONFIG"        # with CI_JOB_TOKEN, {API_VARIABLE}, {SERVER_VARIABLE} set
  kubectl config get-contexts
  kubectl --context group/infra:prod get pods

A job no agent allows gets no kubeconfig: one line on stderr naming its project, exit 1.
"""


#: the same class as the REST client's errors, so one ``except`` catches both
KubeconfigError = RestError


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("kubeconfig", help="print a CI job's kubeconfig (one context per allowed agent)",
                                 description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job-token", metavar="TOKEN",
                        help=f"the job's token (default ${TOKEN_VARIABLE}); prefer the variable: "
                             "arguments show in ps")
    parser.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (listeners.api, not the proxy port), e.g. "
                                                         f"https://kas.example.com:8153 (default ${API_VARIABLE})")
    parser.add_argument("--server", metavar="URL", help=f"kasd's Kubernetes API proxy, e.g. "
                                                        f"https://kas.example.com:8154 (default ${SERVER_VARIABLE})")
    parser.add_argument("--certificate-authority", metavar="FILE", type=Path,
                        help=f"CA (PEM) of kasd's certificates, for both calls (default ${CA_VARIABLE}; "
                             "else the system's)")
    parser.add_argument("--output", "-o", metavar="FILE", type=Path,
                        help="write it to FILE (a new file, mode 0600) instead of stdout")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        text = kubeconfig_text(args, os.environ)
        if args.output is None:
            sys.stdout.write(text)
        else:
            _write_new(args.output, text)
    except KubeconfigError as exc:
        print(f"kasctl kubeconfig: {exc}", file=sys.stderr)
        return exc.code
    return 0


def setting(value: Any, environ: dict[str, str] | os._Environ[str], variable: str, what: str) -> str:
    found = value if value is not None else environ.get(variable)
    if not found:
        raise KubeconfigError(f"missing {what}: pass it or set {variable}", 2)
    return str(found)


def url_setting(value: Any, environ: dict[str, str] | os._Environ[str], variable: str, what: str) -> str:
    """``setting``, which must be an ``https://`` (or ``http://``) URL; without a trailing ``/``."""
    url = setting(value, environ, variable, what).rstrip("/")
    if not url.startswith(("https://", "http://")):
        raise KubeconfigError(f"{what} must be an https:// (or http://) URL, got {url!r}", 2)
    return url


def api_url(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> str:
    """kasd's REST API, from ``--api-url`` or ``$KASCTL_API_URL`` (every command that calls it)."""
    return url_setting(args.api_url, environ, API_VARIABLE, "--api-url")


def kubeconfig_text(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> str:
    token = setting(args.job_token, environ, TOKEN_VARIABLE, "--job-token")
    api = api_url(args, environ)
    server = url_setting(args.server, environ, SERVER_VARIABLE, "--server")
    ca_pem = read_ca(args.certificate_authority or environ.get(CA_VARIABLE))
    answer = allowed_agents(api, token, ca_pem)
    if not answer.get("allowed_agents"):
        raise KubeconfigError(f"no agent allows project {_project_of(answer)} (GET {ALLOWED_AGENTS_PATH} answered "
                              "an empty list): an agent's config file lets a project's jobs in with a ci_access "
                              "entry (docs/authorization.md)")
    return str(yaml.safe_dump(build(answer, server, token, ca_pem), sort_keys=False))


def _project_of(answer: dict[str, Any]) -> str:
    """The job's project path in kasd's answer, printable; ``?`` when the answer lacks it."""
    project = answer.get("project")
    path = project.get("path_with_namespace") if isinstance(project, dict) else None
    return shown(str(path)[:200]) if path else "?"


def allowed_agents(api: str, token: str, ca_pem: bytes | None) -> dict[str, Any]:
    """kasd's answer to ``GET /api/v4/job/allowed_agents`` for ``token``."""
    return rest_call(api, ALLOWED_AGENTS_PATH, token, ca_pem)


def read_ca(ca_value: str | Path | None) -> bytes | None:
    """The PEM of ``--certificate-authority`` (or ``$KASCTL_CA_FILE``); None for the system's."""
    if not ca_value:
        return None
    try:
        return Path(ca_value).read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"cannot read --certificate-authority {ca_value}: {exc.strerror or exc}", 2) from None


def build(answer: dict[str, Any], server: str, token: str, ca_pem: bytes | None) -> dict[str, Any]:
    """The kubeconfig for kasd's ``answer`` (see the module docstring)."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    users, contexts = [], []
    for agent in answer.get("allowed_agents", []):
        try:
            agent_id = check_id(agent.get("id"), "agent id")
        except InvalidNumber as exc:
            raise KubeconfigError(f"kasd's answer is not what kasctl expects: {exc.message}") from None
        extra = agent.get("kasd") or {}
        name = extra.get("context") or f"{agent['config_project']['path_with_namespace']}:{agent_id}"
        namespace = extra.get("namespace") or (agent.get("configuration") or {}).get("default_namespace")
        users.append({"name": f"agent:{agent_id}", "user": {"token": f"ci:{agent_id}:{token}"}})
        context: dict[str, Any] = {"cluster": CLUSTER, "user": f"agent:{agent_id}"}
        if namespace:
            context["namespace"] = namespace
        contexts.append({"name": name, "context": context})
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER, "cluster": cluster}],
        "users": users,
        "contexts": contexts,
    }
    if contexts:
        config["current-context"] = contexts[0]["name"]
    return config


def _write_new(path: Path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KubeconfigError(f"{path} already exists; not overwriting it", 2) from None
    except OSError as exc:
        raise KubeconfigError(f"cannot write {path}: {exc.strerror or exc}", 2) from None
    with os.fdopen(fd, "w") as out:
        out.write(text)


__all__ = ["KubeconfigError", "add_command", "build", "rest_call", "run"]
