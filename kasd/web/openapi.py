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
        # agent configuration from Git (issue 28): kasd.web.gitconfig
        "/api/kasd/v1/config": {"get": _op(
            "The agents' configuration in force: its source (git or files) and, from Git, each config project's "
            "ref and commit (the config projects the caller is a Reporter or more of)", [], _json(s("ConfigState")))},
        "/api/kasd/v1/config/refresh": {"post": {
            **_op("Look for a new commit of the config projects now (a post-receive hook: kasctl notify "
                  "--config-changed); answers once the look is done, with the commits then in force. A personal "
                  "token of a Developer or more of the named config project (or, without one, of any); every "
                  "caller waiting shares one look", [], _json(s("ConfigState"))),
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"project": {"type": ["string", "null"],
                                                             "description": "a config project's path or id"}}}}}},
            "responses": {"200": _json(s("ConfigState")),
                          "202": _json(s("ConfigState"), "the look goes on past 10 s: the commits in force so far"),
                          "413": _error("a body over 4096 bytes"), **_ERRORS}}},
    }
    paths.update(event_paths())
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
        "ConfigState": {"type": "object", "required": ["source", "projects"], "properties": {
            "source": {"type": "string", "enum": ["git", "files"]},
            "projects": {"type": "array", "items": {"type": "object", "properties": {
                "project": {"type": "string"}, "ref": {"type": "string", "description": "HEAD: the default branch"},
                "commit": {"type": "string"}, "loaded_at": {"type": ["string", "null"]}}}}}},
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
    paths.update(_services())
    schemas["Event"] = EVENT_SCHEMA
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


def _services() -> dict[str, Any]:
    """In-cluster services through the agent (docs/services.md): served before the web app by the
    proxy's pipeline (``kasd.web.services``); a CI job token (JOB-TOKEN, ?job_token=) is taken too."""
    agent = _p("agent_id", schema={"type": "integer", "minimum": 1}, description="the agent's id")
    refusals = {
        "400": _error("a '.'/'..' segment or an encoded separator in the path, or a wrong PromQL parameter "
                      "(kasd's {message}); or agentd's Status (traversal)"),
        "401": _error("no or bad token"),
        "403": _error("the agent's config.yaml does not list the caller under services: (kasd's {message}); or "
                      "agentd's Status: method or path outside its allow-list"),
        "404": _error("the agent or the service is not known (kasd's {message}, also when agentd has no such "
                      "service)"),
        "502": _error("the service is unreachable from the agent, or the tunnel failed"),
        "503": _error("the agent is not connected"),
        "504": _error("the service sent no response head in time (agentd's Status)")}
    token = _p("job_token", "query", description="a CI job token (removed before the request goes on)",
               required=False)
    service_op = {
        "summary": "Any request to an in-cluster service of the agent's allow-list, streamed both ways",
        "description": "The rest of the path and the query go to the service (job_token and private_token "
                       "removed; no Authorization, PRIVATE-TOKEN, JOB-TOKEN or Cookie header forwarded). "
                       "An Upgrade (WebSocket) the service accepts becomes a byte pipe (101). The answer is the "
                       "service's, as it sends it.",
        "parameters": [agent, _p("service", description="the service's name in the agent's services:"),
                       _p("path", description="the path at the service"), token],
        "responses": {"200": {"description": "the service's answer (any status it gives)"},
                      "101": {"description": "switched protocols: a byte pipe to the service"}, **refusals}}
    promql = _op("A PromQL query of the agent's Prometheus: instant (time=) or range (start, end, step)",
                 [agent, _p("query", "query", description="the PromQL expression", required=True),
                  _p("time", "query", description="an instant query's time (RFC 3339 or epoch seconds)",
                     required=False),
                  _p("start", "query", required=False), _p("end", "query", required=False),
                  _p("step", "query", description="a range query's resolution (a duration or seconds)",
                     required=False),
                  _p("timeout", "query", required=False),
                  _p("service", "query", description="the service (default prometheus)", required=False), token],
                 _json(_ANY, "Prometheus's answer, as it sends it (its errors: {status: error, errorType, error})"))
    promql["responses"].update(refusals)
    return {"/api/v4/agents/{agent_id}/services/{service}/{path}": {
                method: service_op for method in ("get", "head", "post", "put", "patch", "delete", "options")},
            "/api/kasd/v1/agents/{agent_id}/promql": {"get": promql}}
# ------------------------------------------------------------------ events (issue 28: kasd.web.events)

EVENT_SCHEMA: dict[str, Any] = {"type": "object", "required": ["id", "type", "agent_id", "seq", "state"], "properties": {
    "id": {"type": "string"}, "type": {"type": "string"}, "agent_id": {"type": "integer"},
    "seq": {"type": "integer", "description": "the event's place in its agent's order"},
    "state": {"type": "string", "enum": ["queued", "delivering", "delivered", "failed", "expired"]},
    "posted_at": {"type": "number", "description": "seconds since the epoch"},
    "delivered_at": {"type": ["number", "null"]}, "attempts": {"type": "integer"},
    "outcome": {"type": ["string", "null"], "enum": ["done", "duplicate", "ignored", "failed", None]},
    "detail": {"type": ["string", "null"]}, "pod": {"type": ["string", "null"]}}}


def event_paths() -> dict[str, Any]:
    """Events pushed to agents (docs/events.md). A CI job token (JOB-TOKEN header or job_token
    parameter) of a job the agent's ci_access admits is accepted too."""
    agent = _p("agent_id", schema={"type": "integer", "minimum": 1}, description="the agent's id")
    who = (" Personal token of a Maintainer of the agent's configuration project or of a user its user_access "
           "admits, or a CI job token (JOB-TOKEN) of a job its ci_access admits; not the session cookie.")
    body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["type"], "additionalProperties": False, "properties": {
            "type": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,127}$"},
            "payload": {"description": "any JSON, sent to agentd as is"},
            "id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
                   "description": "default: kasd makes one; an id known for the agent is not queued again"}}}}}}
    post = {"summary": "Push an event to an agent: queued in order, delivered at least once to one agentd pod",
            "description": "Push an event to an agent." + who, "parameters": [agent], "requestBody": body,
            "responses": {"202": _json(s("Event"), "queued"), "200": _json(s("Event"), "an event of that id was "
                                                                                      "already posted: it, unchanged"),
                          **_ERRORS, "413": _error("the body is over 64 KiB"),
                          "429": _error("the agent's queue is full (events.max_queued_per_agent); Retry-After")}}
    listing = {"summary": "The agent's kept events, newest first (at most 100)",
               "description": "The agent's kept events." + who,
               "parameters": [agent, _p("state", "query", {"type": "string", "enum": EVENT_SCHEMA["properties"][
                   "state"]["enum"]})],
               "responses": {"200": _json({"type": "array", "items": s("Event")}), **_ERRORS}}
    one = {"summary": "An event and its delivery status", "description": "An event's delivery status." + who,
           "parameters": [agent, _p("event_id")], "responses": {"200": _json(s("Event")), **_ERRORS}}
    return {"/api/v4/agents/{agent_id}/events": {"post": post, "get": listing},
            "/api/v4/agents/{agent_id}/events/{event_id}": {"get": one}}


if __name__ == "__main__":
    print(json.dumps(document(), indent=2, sort_keys=True))
