"""The paths of GitLab's REST API that kasd serves (``kasd.restapi``) and kasctl calls, in one place
both may import: the standard library only, so a client (``kasctl env stop``, ``kasctl token
revoke``, ``kasctl kubeconfig``) never loads the daemon to learn where to send a request."""

from __future__ import annotations

from urllib.parse import quote

#: GitLab's ``GET /api/v4/job/allowed_agents``: the agents a CI job may use (``kasctl kubeconfig``)
ALLOWED_AGENTS_PATH = "/api/v4/job/allowed_agents"

#: GitLab's stop call, kasd's form (the environment by name): ``kasctl env stop`` calls it
STOP_PATH = "/api/v4/projects/{project}/environments/{environment}/stop"

#: GitLab's "update a job" call, which its runner makes when a job ends (``PUT /api/v4/jobs/:id``,
#: authorized by the job's own token): kasd records the job as finished (``kasctl token revoke``)
FINISH_PATH = "/api/v4/jobs/{job_id}"


def stop_path(project: str, environment: str) -> str:
    """``STOP_PATH`` for a project path (or id) and environment name, each percent-encoded."""
    return STOP_PATH.format(project=quote(project, safe=""), environment=quote(environment, safe=""))


def finish_path(job_id: int) -> str:
    return FINISH_PATH.format(job_id=job_id)


__all__ = ["ALLOWED_AGENTS_PATH", "FINISH_PATH", "STOP_PATH", "finish_path", "stop_path"]
