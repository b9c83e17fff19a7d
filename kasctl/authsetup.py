"""The authorization files of a kasd made from scratch: a signing key pair, a checkout of agents'
config projects, and the tokens jobs and users present. ``kasctl demo`` (``kasctl.stack``) and the
tests lay out a kasd this way, as an operator would (docs/authorization.md):

    auth = AuthSetup(workdir)
    auth.agent_config("group/demo", "demo", "ci_access:\\n  projects:\\n    - id: group/app\\n")
    kasd_config.update(auth.kasd_settings())        # authorization: {config_root, tokens: {public_keys}}
    token = auth.job_token("group/app", job_id=42)   # kubectl sends ci:<agent id>:<token>
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from kasd.authz.agentconfig import agent_config_path
from kasd.authz.jobtokens import JobClaims, mint_job_token, mint_personal_token
from kasd.authz.keys import SigningKey, write_key_pair

#: how long tokens minted here live unless told: a demo (or a test run) is over long before
DEFAULT_TTL = timedelta(hours=12)


class AuthSetup:
    """A new Ed25519 key pair in ``<directory>/keys`` and an empty ``<directory>/config-projects``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = SigningKey.generate()
        self.keys = write_key_pair(directory / "keys", key=self.key)
        self.config_root = directory / "config-projects"
        self.config_root.mkdir(parents=True, exist_ok=True)

    def agent_config(self, config_project: str, agent_name: str, text: str) -> Path:
        """Write an agent's ``.gitlab/agents/<name>/config.yaml`` in its config project's checkout."""
        path = agent_config_path(self.config_root, config_project, agent_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(f".{path.name}.new")
        aside.write_text(text)
        aside.replace(path)  # whole or not at all: a watching kasd never reads half a file
        return path

    def kasd_settings(self) -> dict[str, Any]:
        """kasd's ``authorization:`` section for these files."""
        return {"authorization": {"config_root": str(self.config_root),
                                  "tokens": {"public_keys": [str(self.keys.public)]}}}

    def job_token(self, project: str, *, job_id: int = 1, pipeline_id: int = 1, user: str = "demo",
                  ref: str = "main", ref_type: Literal["branch", "tag"] = "branch", protected: bool = False,
                  environment: str | None = None, environment_tier: str | None = None,
                  project_id: int | None = None, ttl: timedelta = DEFAULT_TTL, now: float | None = None) -> str:
        """A signed CI job token (the part after ``ci:<agent id>:``)."""
        claims = JobClaims(project=project, project_id=project_id, job_id=job_id, pipeline_id=pipeline_id,
                           user=user, ref=ref, ref_type=ref_type, protected=protected, environment=environment,
                           environment_tier=environment_tier)
        return mint_job_token(self.key, claims, ttl, now=now)

    def personal_token(self, user: str, *, ttl: timedelta = DEFAULT_TTL, now: float | None = None) -> str:
        """A signed personal token (the part after ``pat:<agent id>:``)."""
        return mint_personal_token(self.key, user, ttl, now=now)


__all__ = ["DEFAULT_TTL", "AuthSetup"]
