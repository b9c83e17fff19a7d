"""``kasctl keys generate`` and ``kasctl token ci|pat``: make the Ed25519 key pair kasd verifies
tokens with, and mint job and personal tokens with its private half. (``kasctl token revoke``, which
ends a job, is ``kasctl.revoke``.)

A token command prints the token and nothing else on stdout, so ``TOKEN=$(kasctl token ci …)``
works; anything else it has to say goes to stderr. Every mistake (a bad ``--ttl``, an unreadable,
encrypted or public key where the private one is needed) is one line naming the problem, exit 2,
and no key material is ever printed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import UTC, datetime, timedelta

from kasctl.errors import CommandError
from kasd.authz.jobtokens import (
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    ENVIRONMENT_TIERS,
    JobClaims,
    TokenInvalid,
    mint_job_token,
    mint_personal_token,
    verify_job_token,
    verify_personal_token,
)
from kasd.authz.keys import (
    DEFAULT_KEY_NAME,
    KeyFileError,
    KeySet,
    SigningKey,
    load_signing_key,
    write_key_pair,
)
from wire.ids import MAX_ID_DIGITS, InvalidNumber, parse_id

#: where ``--key`` comes from when it is not given
KEY_FILE_VARIABLE = "KASCTL_SIGNING_KEY_FILE"
#: GitLab's longest lifetime for a personal access token; a job token should live minutes to hours
MAX_TTL = timedelta(days=400)
_TTL = re.compile(r"^([0-9]{1,6})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}

KEYS_HELP = f"""\
Make the Ed25519 key pair that signs job and personal tokens:

  <DIR>/{DEFAULT_KEY_NAME}.pem       the private key (PKCS8, mode 0600): for kasctl token, keep it secret
  <DIR>/{DEFAULT_KEY_NAME}.pub.pem   the public key: for kasd, which only verifies

Prints the key id (kid, the key's RFC 7638 thumbprint) that tokens signed with it carry. Existing files
are never overwritten. To rotate keys, generate a new pair in another directory, give kasd both public
keys, sign with the new one, and drop the old public key once its last token has expired.
"""

KEYS_EPILOG = """\
examples:
  kasctl keys generate --out /etc/kasd/keys
  openssl genpkey -algorithm ed25519 -out key.pem   # also works: an unencrypted PKCS8 Ed25519 key
"""

CI_HELP = """\
Mint a CI job token: the job's identity (project, job, pipeline, user, ref, environment), signed, valid
for --ttl. kubectl sends it to kasd's Kubernetes API proxy as

  Authorization: Bearer ci:<agent id>:<job token>

and kasd's ci_access rules decide what the job may do with that agent. Prints the token only.
"""

CI_EPILOG = f"""\
The signing key is --key FILE, else ${KEY_FILE_VARIABLE}.
--ttl is a whole number and a unit: 30s, 15m, 1h, 1d (at most {MAX_TTL.days}d).

examples:
  export {KEY_FILE_VARIABLE}=/etc/kasd/keys/{DEFAULT_KEY_NAME}.pem
  kasctl token ci --project group/app --job-id 42 --pipeline-id 7 --user alice --ref main \\
      --protected --ttl 1h
  TOKEN=$(kasctl token ci --project group/app --job-id 43 --pipeline-id 7 --user alice \\
      --ref feat-x --environment review/feat-x --environment-tier development --ttl 15m)
  kubectl --token "ci:1:$TOKEN" --server https://kasd.example.com:8154 get pods
"""

PAT_HELP = """\
Mint a personal access token for a user, signed, valid for --ttl. kubectl sends it to kasd's Kubernetes
API proxy as

  Authorization: Bearer pat:<agent id>:<token>

and kasd's user_access rules decide what the user may do with that agent. Prints the token only (on
stdout); its id, which revokes it before it expires (docs/authorization.md, Tokens), goes to stderr.
"""

PAT_EPILOG = f"""\
The signing key is --key FILE, else ${KEY_FILE_VARIABLE}.
--ttl is a whole number and a unit: 30s, 15m, 1h, 1d (at most {MAX_TTL.days}d).

examples:
  kasctl token pat --key /etc/kasd/keys/{DEFAULT_KEY_NAME}.pem --user alice --ttl 30d > alice.token
  kubectl --token "pat:1:$(cat alice.token)" --server https://kasd.example.com:8154 get pods
"""


def parse_ttl(text: str) -> timedelta:
    """``30s``, ``15m``, ``1h``, ``1d`` → a positive duration of at most ``MAX_TTL``."""
    found = _TTL.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(
            f"expected a whole number and a unit (s, m, h or d), e.g. 30s, 15m, 1h, 1d; got {text!r}")
    ttl = timedelta(**{_UNITS[found[2]]: int(found[1])})
    if ttl <= timedelta(0):
        raise argparse.ArgumentTypeError(f"must be longer than zero; got {text!r}")
    if ttl > MAX_TTL:
        raise argparse.ArgumentTypeError(f"at most {MAX_TTL.days}d; got {text!r}")
    return ttl


def positive_id(text: str) -> int:
    """An argparse ``type`` for a GitLab id (``wire.ids``: ASCII digits, 1..2^63-1)."""
    try:
        return parse_id(text, "the id")
    except InvalidNumber as exc:
        raise argparse.ArgumentTypeError(f"must be a positive whole number of at most {MAX_ID_DIGITS} digits "
                                         f"({exc.message})") from None


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                 ) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add ``keys`` and ``token`` to kasctl's subcommands; the ``token`` kinds, for ``revoke`` to join."""
    raw = argparse.RawDescriptionHelpFormatter
    keys = commands.add_parser("keys", help="make the key pair that signs job and personal tokens",
                               description="Manage the keys that sign kasd's job and personal tokens.")
    key_commands = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    generate = key_commands.add_parser("generate", help="write a new Ed25519 key pair, print its kid",
                                       description=KEYS_HELP, epilog=KEYS_EPILOG, formatter_class=raw)
    generate.add_argument("--out", required=True, metavar="DIR", help="directory to write the pair into")
    generate.add_argument("--name", default=DEFAULT_KEY_NAME,
                          help=f"file name stem (default {DEFAULT_KEY_NAME}: .pem and .pub.pem)")
    generate.set_defaults(run=_generate)

    token = commands.add_parser("token", help="mint a CI job token or a personal access token; end a job",
                                description="Mint tokens for kasd's Kubernetes API proxy; end a CI job "
                                            "(kasd refuses its tokens from then on).")
    kinds = token.add_subparsers(dest="token_kind", required=True, metavar="KIND")
    ci = kinds.add_parser("ci", help="a CI job token (ci:<agent id>:<token>)", description=CI_HELP,
                          epilog=CI_EPILOG, formatter_class=raw)
    job = ci.add_argument_group("the job")
    job.add_argument("--project", required=True, metavar="PATH", help="the project's full path, e.g. group/app")
    job.add_argument("--project-id", type=positive_id, metavar="N", help="the project's numeric id")
    job.add_argument("--job-id", type=positive_id, required=True, metavar="N")
    job.add_argument("--pipeline-id", type=positive_id, required=True, metavar="N")
    job.add_argument("--user", required=True, metavar="NAME", help="the username the job runs for")
    job.add_argument("--ref", required=True, metavar="REF", help="the branch (or, with --tag, the tag)")
    job.add_argument("--tag", action="store_true", help="--ref names a tag, not a branch")
    job.add_argument("--protected", action="store_true", help="--ref is a protected branch or tag")
    job.add_argument("--environment", metavar="NAME", help="the job's environment, e.g. review/feat-x")
    job.add_argument("--environment-tier", choices=ENVIRONMENT_TIERS, metavar="TIER",
                     help=f"the environment's tier: {', '.join(ENVIRONMENT_TIERS)} (needs --environment)")
    _signing_arguments(ci)
    ci.set_defaults(run=_mint_ci)

    pat = kinds.add_parser("pat", help="a personal access token (pat:<agent id>:<token>)",
                           description=PAT_HELP, epilog=PAT_EPILOG, formatter_class=raw)
    pat.add_argument("--user", required=True, metavar="NAME", help="the username the token stands for")
    _signing_arguments(pat)
    pat.set_defaults(run=_mint_pat)

    return kinds  # ``kasctl token revoke`` (kasctl.revoke) joins them there


def _signing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("signing")
    group.add_argument("--ttl", type=parse_ttl, required=True, help="how long the token is valid: 30s, 15m, 1h, 1d")
    group.add_argument("--key", metavar="FILE",
                       help=f"the private signing key (PEM); default ${KEY_FILE_VARIABLE}")
    group.add_argument("--kid", help="the key id kasd knows the key by (default: its thumbprint)")
    group.add_argument("--audience", default=DEFAULT_AUDIENCE, help=f"aud claim (default {DEFAULT_AUDIENCE})")
    group.add_argument("--issuer", default=DEFAULT_ISSUER, help=f"iss claim (default {DEFAULT_ISSUER})")


def _signing_key(args: argparse.Namespace) -> SigningKey:
    path = args.key or os.environ.get(KEY_FILE_VARIABLE)
    if not path:
        raise CommandError(f"no signing key: give --key FILE or set {KEY_FILE_VARIABLE}")
    try:
        return load_signing_key(path, kid=args.kid)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None


def _mint_ci(args: argparse.Namespace) -> int:
    if args.environment_tier and not args.environment:
        raise CommandError("--environment-tier needs --environment")
    try:
        claims = JobClaims(
            project=args.project, project_id=args.project_id, job_id=args.job_id,
            pipeline_id=args.pipeline_id, user=args.user, ref=args.ref,
            ref_type="tag" if args.tag else "branch", protected=args.protected,
            environment=args.environment, environment_tier=args.environment_tier,
        )  # fmt: skip
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    key = _signing_key(args)
    now = int(time.time())
    token = mint_job_token(key, claims, args.ttl, audience=args.audience, issuer=args.issuer, now=now)
    # the token is proven with the key's public half before it is handed out
    verify_job_token(token, KeySet.of([key.verification_key()]), audience=args.audience,
                     issuer=args.issuer, now=now)
    print(token)
    return 0


def _mint_pat(args: argparse.Namespace) -> int:
    key = _signing_key(args)
    now = int(time.time())
    try:
        token = mint_personal_token(key, args.user, args.ttl, audience=args.audience, issuer=args.issuer, now=now)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    claims = verify_personal_token(token, KeySet.of([key.verification_key()]), audience=args.audience,
                                   issuer=args.issuer, now=now)
    assert claims.stamp is not None
    expires = datetime.fromtimestamp(claims.stamp.expires_at, UTC).isoformat(timespec="seconds")
    print(token)
    print(f"kasctl: personal token for {claims.user}, id {claims.stamp.token_id} (to revoke it), "
          f"expires {expires}", file=sys.stderr)
    return 0


def _generate(args: argparse.Namespace) -> int:
    try:
        files = write_key_pair(args.out, name=args.name)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None
    print(files.kid)
    print(f"kasctl: wrote {files.private} (private, 0600) and {files.public} (public)", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run a ``keys`` or ``token`` command: its exit status; a ``CommandError`` is one line, exit 2."""
    try:
        status: int = args.run(args)
    except (CommandError, TokenInvalid) as exc:
        command = " ".join(part for part in ("kasctl", args.command, getattr(args, "keys_command", None),
                                             getattr(args, "token_kind", None)) if part)
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    return status
