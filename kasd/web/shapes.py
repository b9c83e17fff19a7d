"""The JSON the web app answers with: GitLab's environment shape (``GET
/api/v4/projects/:id/environments``: ``id``, ``name``, ``slug``, ``external_url``, ``state``,
``tier``, ``created_at``, ``updated_at``, …) and kasd's own (``/api/kasd/v1``), and GitLab's
pagination headers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from kasd.web.seams import DeploymentLike, EnvironmentLike, KindProblemLike

#: GitLab's paging: ``per_page`` 20 unless asked, at most 100
DEFAULT_PER_PAGE = 20
MAX_PER_PAGE = 100


def iso(seconds: float | None) -> str | None:
    """GitLab's time stamps: ``2019-05-25T18:55:13.252Z``."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def gitlab_deployment(d: DeploymentLike) -> dict[str, Any]:
    """A deployment as GitLab's ``last_deployment`` (the job's id stands for the deployment's)."""
    at = iso(d.at)
    return {"id": d.job_id, "iid": d.job_id, "ref": d.ref, "sha": None, "created_at": at, "updated_at": at,
            "status": "success", "user": {"username": d.user},
            "deployable": {"id": d.job_id, "status": "success", "ref": d.ref, "pipeline": {"id": d.pipeline_id}}}


def gitlab_project(project_id: int, path: str) -> dict[str, Any]:
    """The part of GitLab's ``BasicProjectDetails`` kasd knows: its id and paths (the name is the
    path's last part: kasd's directory has no display names)."""
    last = path.rsplit("/", 1)[-1]
    return {"id": project_id, "name": last, "path": last, "path_with_namespace": path}


def gitlab_environment(env: EnvironmentLike, *, detail: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": env.id, "name": env.name, "slug": env.slug, "description": None, "external_url": None,
        "project": gitlab_project(env.project_id, env.project),
        "state": env.state, "tier": env.tier, "created_at": iso(env.created_at), "updated_at": iso(env.updated_at),
        "enable_advanced_logs_querying": False, "logs_api_path": None, "auto_stop_at": None,
        "auto_stop_setting": "always",
        "kubernetes_namespace": env.namespaces[0] if len(env.namespaces) == 1 else None,
        "flux_resource_path": None,
        "cluster_agent": {"id": env.agents[0]} if env.agents else None,
    }
    if detail:
        out["last_deployment"] = gitlab_deployment(env.last_deployment) if env.last_deployment else None
    return out


def kasd_deployment(d: DeploymentLike) -> dict[str, Any]:
    return {"job_id": d.job_id, "pipeline_id": d.pipeline_id, "ref": d.ref, "user": d.user, "agent_id": d.agent_id,
            "namespaces": list(d.namespaces), "at": iso(d.at)}


def kasd_environment(env: EnvironmentLike) -> dict[str, Any]:
    return {"id": env.id, "project_id": env.project_id, "project": env.project, "name": env.name, "slug": env.slug,
            "tier": env.tier, "state": env.state, "agents": list(env.agents), "namespaces": list(env.namespaces),
            "created_at": iso(env.created_at), "updated_at": iso(env.updated_at), "stopped_at": iso(env.stopped_at),
            "last_deployment": kasd_deployment(env.last_deployment) if env.last_deployment else None}


def kasd_problem(p: KindProblemLike) -> dict[str, Any]:
    return {"group": p.group, "version": p.version, "kind": p.kind, "namespace": p.namespace, "reason": p.reason,
            "message": p.message}


def page_headers(base: str, query: dict[str, str], page: int, per_page: int, total: int) -> dict[str, str]:
    """GitLab's offset pagination headers (``x-page``, ``x-total``, ``link`` …)."""
    pages = max(1, -(-total // per_page))
    headers = {"x-page": str(page), "x-per-page": str(per_page), "x-total": str(total), "x-total-pages": str(pages),
               "x-next-page": str(page + 1) if page < pages else "", "x-prev-page": str(page - 1) if page > 1 else ""}

    def link(p: int) -> str:
        return f"{base}?{urlencode({**query, 'page': str(p), 'per_page': str(per_page)})}"

    links = []
    if page > 1:
        links.append(f'<{link(page - 1)}>; rel="prev"')
    if page < pages:
        links.append(f'<{link(page + 1)}>; rel="next"')
    links += [f'<{link(1)}>; rel="first"', f'<{link(pages)}>; rel="last"']
    headers["link"] = ", ".join(links)
    return headers


def paginate(items: Sequence[Any], page: int, per_page: int) -> Sequence[Any]:
    start = (page - 1) * per_page
    return items[start:start + per_page]
