"""``authorization:``: where the agents' config projects are checked out, and how CI job tokens
and personal tokens are verified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from daemonkit.settings import Problem, setting
from kasd.authz.snapshot import DEFAULT_MAX_JOB_TOKEN_LIFETIME
from kasd.config.gitconfig import ConfigGitSettings
from kasd.config.values import (
    parse_existing_dir,
    parse_existing_file,
    parse_seconds,
    parse_string,
    parse_strings,
)


def _key_files(value: Any) -> tuple[Path, ...]:
    paths = []
    for i, item in enumerate(parse_strings(value, "")):
        try:
            paths.append(parse_existing_file(item))
        except Problem as problem:
            raise Problem(problem.text, at=f"[{i}]") from None
    return tuple(paths)


def _token_ids(value: Any) -> frozenset[str]:
    return frozenset(parse_strings(value, ""))


@attrs.frozen(kw_only=True)
class TokenSettings:
    """How CI job tokens (``ci:``) and personal tokens (``pat:``) are verified (``kasctl token``)."""

    #: PEM files of the Ed25519 public keys tokens may be signed with (two while rotating); a
    #: private key file stands for its public half
    public_keys: tuple[Path, ...] = setting((), parse=_key_files)
    audience: str = setting("kasd", parse=parse_string)
    issuer: str = setting("kasd", parse=parse_string)
    #: how far clocks may disagree
    leeway: float = setting(60.0, parse=parse_seconds)
    #: token ids (``jti``, printed by ``kasctl token``) refused before they expire
    revoked: frozenset[str] = setting(frozenset(), parse=_token_ids)
    #: seconds a job token may live (``exp - iat``); longer ones are refused. A finished job's
    #: record (``kasctl token revoke``) lasts this long, so it outlives every token of the job.
    max_job_token_lifetime: float = setting(DEFAULT_MAX_JOB_TOKEN_LIFETIME.total_seconds(), parse=parse_seconds)


@attrs.frozen(kw_only=True)
class AuthorizationSettings:
    #: where the agents' config projects are checked out: <config_root>/<project path>/.gitlab/agents/<name>/config.yaml
    config_root: Path | None = setting(None, parse=parse_existing_dir)
    tokens: TokenSettings = TokenSettings()
    #: read config_root as Git repositories (``kasd.config.gitconfig``)
    config_git: ConfigGitSettings = ConfigGitSettings()

    @property
    def enabled(self) -> bool:
        return self.config_root is not None
