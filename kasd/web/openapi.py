"""The OpenAPI 3.1 document of the web app's paths (served at ``/api/kasd/v1/openapi.json``, kept
in ``docs/openapi.json``: ``python -m kasd.web.openapi > docs/openapi.json``; a test keeps them
equal and checks every route is described)."""

from __future__ import annotations

import json
from typing import Any

_MSG = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}


def _error(text: str, schema: str = "Message") -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


# what every operation may answer (a filter GitLab validates answers {"error": …}, as GitLab's Grape does;
# the store failing answers 503)
_ERRORS = {"400": _error("bad input, named", "BadRequest"), "401": _error("no or bad token or session"),
           "403": _error("not allowed (the reason; a cookie call without its CSRF token)"),
           "404": _error("unknown, or not visible to the caller"),
           "503": _error("kasd's store failed, or the agent is not connected")}
# what an operation that goes through the agent may answer besides
_AGENT_ERRORS = {"409": _error("the cluster refused: conflict"), "422": _error("the cluster refused: invalid"),
                 "429": _error("the agent or the cluster is too busy"),
                 "502": _error("the agent or the cluster failed"),
                 "504": _error("the agent or the environment's objects did not answer in time")}
# what a streamed answer may answer before it starts
_STREAM_ERRORS = {"429": _error("too many live streams (graph or log) open for this user; Retry-After")}


def _p(name: str, where: str = "path", schema: dict[str, Any] | None = None, description: str = "",
       required: bool | None = None) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path" if required is None else required,
            "schema": schema or {"type": "string"}, "description": description}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _op(summary: str, params: list[dict[str, Any]], ok: dict[str, Any], *, csrf: bool = False,
        agent: bool = False, stream: bool = False) -> dict[str, Any]:
    description = summary + (" With the session cookie, the X-CSRF-Token header (or csrf_token query parameter) "
                             "must carry the session's CSRF token." if csrf else "")
    return {"summary": summary, "description": description, "parameters": params,
            "responses": {"200": ok, **_ERRORS, **(_AGENT_ERRORS if agent else {}),
                          **(_STREAM_ERRORS if stream else {})}}


_ENV_ID = _p("env_id", schema={"type": "integer", "minimum": 1}, description="the environment's id")
_PROJECT = _p("project", description="the project's id or URL-encoded full path (group%2Fapp)")
_OBJ = [_ENV_ID, _p("group", description="API group; core for the core group"), _p("version"), _p("kind"),
        _p("namespace", description="_ for a cluster-scoped object"), _p("name")]
_GL_FILTERS = [_p("states", "query", {"type": "string", "enum": ["available", "stopping", "stopped"]}),
               _p("tier", "query", {"type": "string", "enum": ["production", "staging", "testing", "development",
                                                                   "other"]}),
               _p("page", "query", {"type": "integer", "minimum": 1}),
               _p("per_page", "query", {"type": "integer", "minimum": 1, "maximum": 100})]
_ANY = {"type": "object"}


def s(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/-/sign_in": {"post": {
            "summary": "Sign in with a personal token: sets the _kasd_session cookie (HttpOnly, SameSite=Strict)",
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"type": "object", "properties": {"token": {"type": "string"}},
                                                "required": ["token"]}},
                "application/x-www-form-urlencoded": {"schema": {"type": "object", "properties": {
                    "token": {"type": "string"}}, "required": ["token"]}}}},
            "responses": {"200": _json(s("Session")), "303": {"description": "a form: to the dashboard"},
                          "429": {"description": "too many attempts from this source"},
                          "415": _error("neither JSON nor a form"), **_ERRORS}}},
        "/-/sign_out": {"post": {**_op("End the session (clears the cookie)", [], {"description": "done"}, csrf=True),
                                 "responses": {"204": {"description": "signed out"}, **_ERRORS}}},
        "/-/session": {"get": _op("The session's user, expiry and CSRF token", [], _json(s("Session")))},
        "/api/v4/projects/{project}/environments": {"get": _op(
            "GitLab's list of a project's environments (Reporter)",
            [_PROJECT, _p("name", "query"), _p("search", "query", description="3 characters or more"), *_GL_FILTERS],
            _json({"type": "array", "items": s("GitlabEnvironment")}))},
        "/api/v4/projects/{project}/environments/{env_id}": {"get": _op(
            "GitLab's environment", [_PROJECT, _ENV_ID], _json(s("GitlabEnvironment")))},
        "/api/v4/groups/{group}/environments": {"get": _op(
            "The environments of a group's projects the caller may see (kasd's addition)",
            [_p("group", description="the group's id or URL-encoded full path"), *_GL_FILTERS],
            _json({"type": "array", "items": s("GitlabEnvironment")}))},
        "/api/kasd/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": _json(_ANY)}}},
        "/api/kasd/v1/agents": {"get": _op("Agents the caller may see, with their connections", [],
                                           _json({"type": "array", "items": s("Agent")}))},
        "/api/kasd/v1/agents/{agent_id}/cluster": {"get": _op(
            "The agent's latest cluster discovery report per connected pod (docs/discovery.md); 404 for an "
            "agent the caller may not see", [_p("agent_id", schema={"type": "integer", "minimum": 1})],
            _json({"type": "object", "properties": {
                "id": {"type": "integer"}, "name": {"type": "string"},
                "pods": {"type": "array", "items": s("PodClusterReport")}}}))},
        "/api/kasd/v1/environments/{env_id}": {"get": _op(
            "An environment and its health (roll-up)", [_ENV_ID, _p("agent", "query", {"type": "integer"})],
            _json({"type": "object", "properties": {"environment": s("Environment"), "health": s("Health")}}),
            agent=True)},
        "/api/kasd/v1/environments/{env_id}/resources": {"get": _op(
            "The environment's objects as a graph (seen through its agent's user_access)",
            [_ENV_ID, _p("agent", "query", {"type": "integer"})],
            _json({"type": "object", "properties": {"environment": s("Environment"), "graph": s("Graph"),
                                                    "problems": {"type": "array", "items": _ANY},
                                                    "hint": {"type": ["string", "null"]}}}), agent=True)},
        "/api/kasd/v1/environments/{env_id}/resources/watch": {"get": _op(
            "Server-sent events: graph (the whole graph after each batch of changes), problems, end; ': ping' "
            "comments every 15 s", [_ENV_ID, _p("agent", "query", {"type": "integer"})],
            {"description": "event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}},
            agent=True, stream=True)},
        "/api/kasd/v1/environments/{env_id}/deployments": {"get": _op(
            "Deployment history, newest first", [_ENV_ID, _p("limit", "query", {"type": "integer", "minimum": 1,
                                                                                  "maximum": 500})],
            _json({"type": "array", "items": s("Deployment")}))},
        "/api/kasd/v1/environments/{env_id}/objects/{group}/{version}/{kind}/{namespace}/{name}": {"get": _op(
            "One object of the environment's graph (application/yaml when asked)", _OBJ,
            {"description": "the object", "content": {"application/json": {"schema": _ANY},
                                                      "application/yaml": {"schema": {"type": "string"}}}},
            agent=True)},
        "/api/kasd/v1/environments/{env_id}/objects/{group}/{version}/{kind}/{namespace}/{name}/events": {"get": _op(
            "The events of one object of the graph", _OBJ,
            _json({"type": "object", "properties": {"events": {"type": "array", "items": _ANY}}}), agent=True)},
        "/api/kasd/v1/environments/{env_id}/pods/{namespace}/{name}/log": {"get": _op(
            "A pod's log, streamed", [_ENV_ID, _p("namespace"), _p("name"), _p("container", "query"),
                                      _p("follow", "query", {"type": "string", "enum": ["true", "false"]}),
                                      _p("tailLines", "query", {"type": "integer", "minimum": 0,
                                                                "maximum": 100000})],
            {"description": "the log", "content": {"text/plain": {"schema": {"type": "string"}}}},
            agent=True, stream=True)},
        "/api/kasd/v1/environments/{env_id}/pods/{namespace}/{name}": {"delete": _op(
            "Delete a pod of the graph (Developer)", [_ENV_ID, _p("namespace"), _p("name")], _json(_ANY), csrf=True,
            agent=True)},
        "/api/kasd/v1/environments/{env_id}/flux/{kind}/{namespace}/{name}/reconcile": {"post": _op(
            "Ask Flux to reconcile an object of the graph now (reconcile.fluxcd.io/requestedAt; Developer)",
            [_ENV_ID, _p("kind"), _p("namespace"), _p("name")], _json(_ANY), csrf=True, agent=True)},
    }
    health = {"type": "object", "properties": {"status": {"type": "string", "enum": [
        "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"]}, "message": {"type": "string"}},
        "required": ["status", "message"]}
    schemas = {
        "Message": _MSG, "Health": health,
        "BadRequest": {"oneOf": [_MSG, {"type": "object", "properties": {"error": {"type": "string"}},
                                        "required": ["error"]}]},
        "Session": {"type": "object", "properties": {"user": {"type": "string"}, "expires_at": {"type": "string"},
                                                     "csrf_token": {"type": "string"}}},
        "GitlabEnvironment": {"type": "object", "required": ["id", "name", "slug", "state"], "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "slug": {"type": "string"},
            "external_url": {"type": ["string", "null"]}, "state": {"type": "string"},
            "tier": {"type": ["string", "null"]}, "created_at": {"type": "string"}, "updated_at": {"type": "string"},
            "project": {"type": "object", "description": "GitLab's BasicProjectDetails, the fields kasd knows",
                        "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                       "path": {"type": "string"}, "path_with_namespace": {"type": "string"}}}}},
        "Environment": {"type": "object", "properties": {
            "id": {"type": "integer"}, "project_id": {"type": "integer"}, "project": {"type": "string"},
            "name": {"type": "string"}, "slug": {"type": "string"}, "tier": {"type": ["string", "null"]},
            "state": {"type": "string"}, "agents": {"type": "array", "items": {"type": "integer"}},
            "namespaces": {"type": "array", "items": {"type": "string"}}}},
        "Deployment": {"type": "object", "properties": {
            "job_id": {"type": "integer"}, "pipeline_id": {"type": "integer"}, "ref": {"type": "string"},
            "user": {"type": "string"}, "agent_id": {"type": "integer"},
            "namespaces": {"type": "array", "items": {"type": "string"}}, "at": {"type": "string"}}},
        "Agent": {"type": "object", "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "config_project": {"type": "string"},
            "connections": {"type": "array", "items": s("AgentConnection")}}},
        "AgentConnection": {"type": "object", "description": "one tunnel of one agentd pod (null fields: a "
                            "replica the tunnel directory names whose records are missing)", "properties": {
            "pod": {"type": ["string", "null"]}, "pod_uid": {"type": ["string", "null"]},
            "pod_namespace": {"type": ["string", "null"]}, "node": {"type": ["string", "null"]},
            "namespaces": {"type": ["array", "null"], "items": {"type": "string"},
                           "description": "the namespaces the pod serves; empty: the whole cluster"},
            "version": {"type": ["string", "null"]}, "since": {"type": ["string", "null"]},
            "replica": {"type": "string"}}},
        "PodClusterReport": {"type": "object", "properties": {
            "pod": {"type": "string"}, "pod_uid": {"type": "string"}, "replica": {"type": "string"},
            "received_at": {"type": "string"}, "report": s("ClusterReport")}},
        "ClusterReport": {"type": "object", "properties": {
            "observed_at": {"type": "string"},
            "server": {"type": "object", "properties": {"gitVersion": {"type": "string"},
                                                        "platform": {"type": "string"}}},
            "nodes": {"type": ["integer", "null"]},
            "api_groups": {"type": "array", "items": {"type": "string"}},
            "crds": {"type": "array", "items": {"type": "string"}},
            "components": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "evidence": {"type": "array", "items": {"type": "string"}}}}},
            "rbac": {"type": "array", "items": {"type": "object", "properties": {
                "namespace": {"type": "string"}, "resource_rules": {"type": "array", "items": _ANY},
                "non_resource_rules": {"type": "array", "items": _ANY}, "incomplete": {"type": "boolean"}}}},
            "errors": {"type": "array", "items": {"type": "string"}}}},
        "Graph": {"type": "object", "properties": {
            "health": {"$ref": "#/components/schemas/Health"},
            "nodes": {"type": "array", "items": _ANY}, "edges": {"type": "array", "items": _ANY},
            "roots": {"type": "array", "items": {"type": "string"}}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "kasd environments API", "version": "1",
                 "description": "Personal token in PRIVATE-TOKEN or Authorization: Bearer; or the session cookie "
                                "(POST /-/sign_in) with X-CSRF-Token on calls that change something."},
        "components": {"schemas": schemas, "securitySchemes": {
            "privateToken": {"type": "apiKey", "in": "header", "name": "PRIVATE-TOKEN"},
            "bearer": {"type": "http", "scheme": "bearer"},
            "session": {"type": "apiKey", "in": "cookie", "name": "_kasd_session"}}},
        "security": [{"privateToken": []}, {"bearer": []}, {"session": []}],
        "paths": paths,
    }


if __name__ == "__main__":
    print(json.dumps(document(), indent=2, sort_keys=True))
