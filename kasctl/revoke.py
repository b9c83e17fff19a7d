"""``kasctl token revoke``: end a CI job. kasd records the job as finished (in its store: SQLite
alone, Redis among replicas) and every replica refuses every token of that job from then on, until
the last of them would have expired anyway.

Two ways to name the job:

- **the job itself** (the usual way, the last step of a CI job): its own token, ``--job-token`` or
  ``$CI_JOB_TOKEN``; nothing else is needed. It is what GitLab's runner does when a job ends
  (``PUT /api/v4/jobs/:id`` with the job's token), and what makes GitLab's ``CI_JOB_TOKEN`` die.
- **the operator**, for a job whose token leaked or whose runner died: ``--project`` and ``--job-id``
  with the signing key ``kasctl token ci`` mints with (``--key`` or ``$KASCTL_SIGNING_KEY_FILE``).
  Whoever holds that key can already act as any job, so kasctl mints a one-minute token for that job
  and makes the same call with it; kasd needs no other credential, and keeps no list of operators.

Errors are one line on stderr (exit 1: kasd unreachable or refusing; exit 2: a wrong command line),
never quoting a token. The HTTP call never follows a redirect: a job token goes to ``--api-url`` and
nowhere else.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

from kasctl.errors import CommandError
from kasctl.kubeconfig import (
    API_VARIABLE,
    CA_VARIABLE,
    TOKEN_VARIABLE,
    KubeconfigError,
    api_url,
    read_ca,
    setting,
)
from kasctl.restclient import rest_call
from kasctl.tokens import _signing_key, positive_id
from kasd.authz.jobtokens import DEFAULT_AUDIENCE, DEFAULT_ISSUER, JobClaims, mint_job_token
from kasd.restpaths import FINISH_PATH, finish_path

#: how long the token kasctl mints to finish a job by its id lives
OPERATOR_TOKEN_TTL = timedelta(minutes=1)

HELP = f"""\
End a CI job: kasd records it as finished and every kasd replica refuses each of its tokens from
then on (until they have all expired). Calls kasd's REST API: PUT {FINISH_PATH}, authorized
by the job's own token, as GitLab's runner does when a job ends.

As the last step of a CI job:
  kasctl token revoke                      # CI_JOB_TOKEN and {API_VARIABLE} (and {CA_VARIABLE}) set

As the operator, for a job whose token leaked (with the key kasctl token ci signs with):
  kasctl token revoke --project group/app --job-id 42 --key /etc/kasd/keys/jobtoken-signing.pem
"""


def add_command(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``revoke`` to ``kasctl token``'s kinds."""
    revoke = kinds.add_parser("revoke", help="end a CI job: kasd refuses its tokens from now on", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    revoke.add_argument("--job-token", metavar="TOKEN",
                        help=f"the job's own token (default ${TOKEN_VARIABLE}); prefer the variable: arguments show in ps")
    operator = revoke.add_argument_group("the operator: a job by its id, with the signing key")
    operator.add_argument("--project", metavar="PATH", help="the job's project, e.g. group/app")
    operator.add_argument("--job-id", type=positive_id, metavar="N", help="the job to end")
    operator.add_argument("--key", metavar="FILE", help="the private signing key (default $KASCTL_SIGNING_KEY_FILE)")
    operator.add_argument("--kid", help="the key id kasd knows the key by (default: its thumbprint)")
    operator.add_argument("--audience", default=DEFAULT_AUDIENCE, help=f"aud claim (default {DEFAULT_AUDIENCE})")
    operator.add_argument("--issuer", default=DEFAULT_ISSUER, help=f"iss claim (default {DEFAULT_ISSUER})")
    revoke.add_argument("--api-url", metavar="URL", help=f"kasd's REST API (default ${API_VARIABLE})")
    revoke.add_argument("--certificate-authority", metavar="FILE",
                        help=f"CA (PEM) of kasd's certificate (default ${CA_VARIABLE}; else the system's)")
    revoke.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        answer = revoke(args, os.environ)
    except KubeconfigError as exc:
        print(f"kasctl token revoke: {exc}", file=sys.stderr)
        return exc.code
    print(f"job {answer.get('id')} of {answer.get('project')} is finished: kasd refuses its tokens "
          f"(until {answer.get('tokens_refused_until')}, when the last of them has expired)")
    return 0


def revoke(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """kasd's answer to finishing the job ``args`` names (see the module docstring)."""
    api = api_url(args, environ)
    if args.job_id is not None or args.project is not None:
        if args.job_token is not None:
            raise KubeconfigError("give either --job-token (the job itself) or --project and --job-id (the operator), "
                                  "not both", 2)
        if args.job_id is None or args.project is None:
            raise KubeconfigError("--project and --job-id go together: the job to end, by its id", 2)
        token, job_id = _operator_token(args), args.job_id
    else:
        token = setting(args.job_token, environ, TOKEN_VARIABLE, "--job-token")
        job_id = job_id_of(token)
    ca_pem = read_ca(args.certificate_authority or environ.get(CA_VARIABLE))
    # kasctl's one REST client: it follows no redirect, so the token goes to --api-url only
    return rest_call(api, finish_path(job_id), token, ca_pem, method="PUT", body={})


def _operator_token(args: argparse.Namespace) -> str:
    """A one-minute token for the job ``--project``/``--job-id`` names, signed with the operator's
    key. kasd reads only its job id; the other claims a job token must carry are placeholders."""
    try:
        key = _signing_key(args)
        claims = JobClaims(project=args.project, job_id=args.job_id, pipeline_id=1, user="kasctl", ref="revoke")
    except CommandError as exc:
        raise KubeconfigError(str(exc), 2) from None
    except ValueError as exc:
        raise KubeconfigError(str(exc), 2) from None
    return mint_job_token(key, claims, OPERATOR_TOKEN_TTL, audience=args.audience, issuer=args.issuer,
                          now=time.time())


def job_id_of(token: str) -> int:
    """The ``job_id`` claim a job token carries (read, not verified: kasd verifies it), to name the
    job in the call's path; ``KubeconfigError`` (never quoting the token) if it has none."""
    parts = token.strip().split(".")
    try:
        if len(parts) != 3 or len(token) > 16 * 1024:
            raise ValueError
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        job_id = payload["job_id"]
        if type(job_id) is not int or job_id <= 0:
            raise ValueError
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise KubeconfigError("the job token is not a kasd CI job token (it names no job_id)", 2) from None
    return job_id


__all__ = ["add_command", "job_id_of", "revoke", "run"]
