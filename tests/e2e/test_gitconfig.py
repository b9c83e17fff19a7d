"""Agent configuration read from a real Git repository by real kasd replicas (sharing a Redis):
commits change which CI jobs may use the agent (``GET /api/v4/job/allowed_agents``), at once when a
push hook calls ``POST /api/kasd/v1/config/refresh`` on one replica (the other hears it through
Redis), and by polling the ref without the call."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from kasctl.authsetup import AuthSetup
from kasd.tokens import hash_token
from tests.daemons import StderrLog, running_daemon
from tests.gitrepo import GitRepo
from tests.kasd.helpers import http_request
from tests.redisproc import RedisProcess

pytestmark = pytest.mark.timeout(90)

CONFIG = ".gitlab/agents/prod/config.yaml"
ALLOW_APP = "ci_access:\n  projects:\n    - id: group/app\n"
ALLOW_OTHER = "ci_access:\n  projects:\n    - id: group/other\n"


def _kasd_yaml(path: Path, auth: AuthSetup, root: Path, redis: str, poll: float) -> None:
    settings = auth.kasd_settings()
    settings["authorization"]["config_root"] = str(root)
    settings["authorization"]["config_git"] = {"enabled": True, "poll_interval": poll}
    (path.parent / "peer-secret").write_text("s" * 40)
    path.write_text(yaml.safe_dump({
        "listeners": {name: {"address": "127.0.0.1:0"} for name in
                      ("agent", "observability", "kubernetes_api", "api", "private")},
        "agents": [{"id": 1, "name": "prod", "config_project": "group/infra", "token_sha256": hash_token("t" * 40)}],
        "groups": [{"path": "group", "id": 10}],
        "projects": [{"path": "group/infra", "id": 1}, {"path": "group/app", "id": 42},
                     {"path": "group/other", "id": 43}],
        "users": [{"username": "pusher", "memberships": {"group/infra": "developer"}}],
        "routing": {"redis": {"url": redis}, "peer_secret_file": str(path.parent / "peer-secret")},
        **settings,
    }))


async def _allowed(api: int, token: str) -> list[int]:
    reply = await http_request(api, "GET", "/api/v4/job/allowed_agents", [("JOB-TOKEN", token)])
    if reply.status == 403:
        return []
    assert reply.status == 200, reply.body
    return [agent["id"] for agent in json.loads(reply.body)["allowed_agents"]]


async def test_commits_change_access_on_every_replica(tmp_path: Path, redis_server: RedisProcess) -> None:
    redis_server.command("FLUSHALL")
    auth = AuthSetup(tmp_path / "auth")
    root = tmp_path / "repositories"
    repo = GitRepo(root / "group" / "infra.git")  # bare, where GitLab keeps a project's repository
    repo.commit({CONFIG: ALLOW_APP})
    config = tmp_path / "kasd.yaml"
    _kasd_yaml(config, auth, root, redis_server.url, poll=3600)
    job = auth.job_token("group/app", job_id=5)
    pusher = [("PRIVATE-TOKEN", auth.personal_token("pusher")), ("Content-Type", "application/json")]
    with trio.fail_after(80):
        async with AsyncExitStack() as stack:
            logs: list[StderrLog] = []
            apis: list[int] = []
            for name in ("a", "b"):
                ready = tmp_path / f"{name}-ready.json"
                log = await stack.enter_async_context(running_daemon(
                    "kasd", ["--config", str(config), "--ready-file", str(ready)]))
                await log.until("kasd listening")
                logs.append(log)
                apis.append(int(json.loads(ready.read_text())["api"].rsplit(":", 1)[1]))
            assert [await _allowed(api, job) for api in apis] == [[1], [1]]

            # a push, then the hook: replica a looks at once and answers with the commit now in force;
            # b hears it through Redis (polling is hourly here)
            refused = repo.commit({CONFIG: ALLOW_OTHER})
            reply = await http_request(apis[0], "POST", "/api/kasd/v1/config/refresh", pusher,
                                       body=b'{"project": "group/infra"}')
            assert reply.status == 200, reply.body
            answer: Any = json.loads(reply.body)
            assert answer["source"] == "git"
            assert [(p["project"], p["ref"], p["commit"]) for p in answer["projects"]] == [
                ("group/infra", "HEAD", refused)]
            assert await _allowed(apis[0], job) == []
            await logs[1].until(f"→{refused[:12]}")
            assert await _allowed(apis[1], job) == []

            # without the hook: polling (kasd.yaml's change is read by the file watch) finds the commit
            _kasd_yaml(config, auth, root, redis_server.url, poll=0.2)
            for log in logs:
                await log.until(f"authorization reloaded (changed: {config}")
            allowed = repo.commit({CONFIG: ALLOW_APP + "    - id: group/other\n"})
            for log in logs:
                await log.until(f"→{allowed[:12]}")
            assert [await _allowed(api, job) for api in apis] == [[1], [1]]
            shown = await http_request(apis[1], "GET", "/api/kasd/v1/config", pusher[:1])
            assert json.loads(shown.body)["projects"][0]["commit"] == allowed
