"""CiAuthority: grants from signed tokens and the agents' config.yaml, remembered between requests;
reloads that replace the whole configuration or, when a file is bad, nothing at all."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from kasctl.authsetup import AuthSetup
from kasd import authority as authority_module
from kasd.authority import (
    CiAuthority,
    LoadedAuthorization,
    LoadError,
    config_loader,
    load_authorization,
    restart_only_changes,
)
from kasd.authz.slugs import environment_slug
from kasd.config import Config, config_from_mapping
from kasd.metrics import Metrics
from kasd.seams import AccessDenied, Grant, parse_bearer
from kasd.tokens import hash_token
from routing.local import TunnelRegistry

APP_ONLY = "ci_access:\n  projects:\n    - id: acme/app\n"


def _config(auth: AuthSetup, agents: int = 4) -> Config:
    return config_from_mapping({
        "agents": [{"id": i, "name": f"a{i}", "config_project": "acme/infra", "token_sha256": hash_token(f"agent-{i}")}
                   for i in range(1, agents + 1)],
        "groups": [{"path": "acme", "id": 1}],
        "projects": [{"path": "acme/infra", "id": 10}, {"path": "acme/app", "id": 11}, {"path": "acme/other", "id": 12}],
        "users": [{"username": "alice", "memberships": {"acme/app": "developer"}}],
        **auth.kasd_settings(),
    })


@pytest.fixture
def auth(tmp_path: Path) -> AuthSetup:
    setup = AuthSetup(tmp_path)
    setup.agent_config("acme/infra", "a1", APP_ONLY)
    for i in (2, 3, 4):
        setup.agent_config("acme/infra", f"a{i}", APP_ONLY + "user_access:\n  access_as: {agent: {}}\n"
                                                            "  projects: [{id: acme/app}]\n")
    return setup


class _Files:
    """A ``load`` that reads the config an attribute holds (a test swaps it to simulate an edit)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.loads = 0

    def __call__(self) -> LoadedAuthorization:
        self.loads += 1
        return load_authorization(self.config, None)


async def _authorize(authority: CiAuthority, authorization: str | None) -> Grant:
    """What the pipeline does with a request's Authorization header: parse it, ask the authority."""
    credentials = parse_bearer(authorization)
    return await authority.authorize(credentials, credentials.agent_id)


async def test_a_remembered_grant_is_the_same_answer_as_the_first(auth: AuthSetup) -> None:
    authority = CiAuthority(_Files(_config(auth)))
    token = auth.job_token("acme/app", job_id=5)
    first = await _authorize(authority, f"Bearer ci:1:{token}")
    again = await _authorize(authority, f"Bearer ci:1:{token}")
    assert again == first
    assert (again.kind, again.agent_id, again.subject, again.access_as) == ("ci", 1, "ci_job:5", "agent")


async def test_a_remembered_grant_opens_nothing_else(auth: AuthSetup) -> None:
    authority = CiAuthority(_Files(_config(auth)))
    job = auth.job_token("acme/app")
    await _authorize(authority, f"Bearer ci:1:{job}")
    with pytest.raises(AccessDenied) as denied:
        await _authorize(authority, f"Bearer pat:1:{job}")  # the same token under the wrong kind
    assert denied.value.status == 401 and "not a personal token" in denied.value.message
    with pytest.raises(AccessDenied) as denied:
        await _authorize(authority, f"Bearer ci:9:{job}")  # an agent kasd does not know
    assert denied.value.status == 403


async def test_refusals_are_checked_every_time(auth: AuthSetup) -> None:
    files = _Files(_config(auth))
    authority = CiAuthority(files)
    other = auth.job_token("acme/other")
    for _ in range(2):
        with pytest.raises(AccessDenied) as denied:
            await _authorize(authority, f"Bearer ci:1:{other}")
        assert denied.value.status == 403
        assert "does not authorize project acme/other" in denied.value.message
    assert authority._granted == {}
    with pytest.raises(AccessDenied):
        await _authorize(authority, None)


async def test_the_remembered_grants_are_bounded(auth: AuthSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authority_module, "GRANT_CACHE_SIZE", 3)
    authority = CiAuthority(_Files(_config(auth)))
    pat = auth.personal_token("alice")
    for agent in (2, 3, 4):
        assert (await _authorize(authority, f"Bearer pat:{agent}:{pat}")).agent_id == agent
    assert len(authority._granted) == 3
    job = auth.job_token("acme/app")
    await _authorize(authority, f"Bearer ci:1:{job}")
    assert len(authority._granted) == 3 and ("pat", pat, 2) not in authority._granted  # the oldest went first


async def test_an_expired_token_is_refused_even_if_its_grant_was_remembered(auth: AuthSetup) -> None:
    now = [1_800_000_000.0]
    authority = CiAuthority(_Files(_config(auth)), clock=lambda: now[0])
    token = auth.job_token("acme/app", ttl=timedelta(minutes=5), now=now[0])
    assert (await _authorize(authority, f"Bearer ci:1:{token}")).agent_id == 1
    now[0] += 5 * 60 + 61  # past expiry and the leeway
    with pytest.raises(AccessDenied) as denied:
        await _authorize(authority, f"Bearer ci:1:{token}")
    assert denied.value.status == 401 and "expired" in denied.value.message


async def test_a_reload_replaces_everything_and_forgets_grants(auth: AuthSetup) -> None:
    files = _Files(_config(auth))
    metrics = Metrics(TunnelRegistry())
    authority = CiAuthority(files, metrics)
    job = auth.job_token("acme/app")
    await _authorize(authority, f"Bearer ci:1:{job}")
    auth.agent_config("acme/infra", "a1", "ci_access:\n  projects:\n    - id: acme/other\n")
    assert await authority.reload("test")
    with pytest.raises(AccessDenied) as denied:  # the remembered grant went with the old files
        await _authorize(authority, f"Bearer ci:1:{job}")
    assert denied.value.status == 403
    assert _sample(metrics, "kasd_authz_reloads_total", result="ok") == 1
    assert _sample(metrics, "kasd_authz_config_ok") == 1


async def test_a_bad_file_changes_nothing_and_says_where(auth: AuthSetup, caplog: pytest.LogCaptureFixture) -> None:
    files = _Files(_config(auth))
    metrics = Metrics(TunnelRegistry())
    authority = CiAuthority(files, metrics)
    job = auth.job_token("acme/app")
    path = auth.agent_config("acme/infra", "a1", "ci_access:\n  projects:\n    - id: acme/app\n      rules:\n"
                                                 "        - if: $CI_COMMIT_BRANCH ==\n")
    assert not await authority.reload("test")
    assert (await _authorize(authority, f"Bearer ci:1:{job}")).agent_id == 1  # the previous configuration
    assert f"{path}:5:35: ci_access.projects[0].rules[0].if: expected a value after" in caplog.text
    assert "the previous configuration stays in force" in caplog.text
    assert _sample(metrics, "kasd_authz_reloads_total", result="failed") == 1
    assert _sample(metrics, "kasd_authz_config_ok") == 0


async def test_a_changed_file_is_reloaded_by_the_watch(auth: AuthSetup) -> None:
    files = _Files(_config(auth))
    authority = CiAuthority(files)
    job = auth.job_token("acme/other")
    with pytest.raises(AccessDenied):
        await _authorize(authority, f"Bearer ci:1:{job}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch, 0.02)
        await trio.sleep(0.2)  # ten looks at the files
        assert files.loads == 1  # nothing changed: nothing read
        auth.agent_config("acme/infra", "a1", "ci_access:\n  projects:\n    - id: acme/other\n")
        with trio.fail_after(5):
            await authority.wait_reloaded()
        assert files.loads == 2 and authority.generation == 2
        nursery.cancel_scope.cancel()
    assert (await _authorize(authority, f"Bearer ci:1:{job}")).agent_id == 1


def _sample(metrics: Metrics, name: str, **labels: Any) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_reload_names_the_settings_only_a_restart_applies(auth: AuthSetup, caplog: pytest.LogCaptureFixture) -> None:
    """The operator edits kasd.yaml: the authorization part is reloaded, and a changed listener or
    timeout is not silently ignored."""
    running = _config(auth)
    edited = attrs.evolve(running, agent_wait_timeout=running.agent_wait_timeout + 5)
    assert restart_only_changes(running, running) == []
    assert restart_only_changes(running, edited) == ["agent_wait_timeout"]
    load = config_loader(lambda: (edited, None), running=running)
    load()
    assert "configuration reload: agent_wait_timeout changed; only a restart applies them" in caplog.text


MANAGED = ("ci_access:\n  projects:\n    - id: acme/app\n      access_as: {ci_job: {}}\n"
           "      resource_management: {enabled: true}\n")


def _templates(auth: AuthSetup, agent: str) -> Path:
    directory = auth.agent_config("acme/infra", agent, MANAGED).parent / "environment_templates"
    directory.mkdir(exist_ok=True)
    return directory


async def test_a_bad_template_changes_nothing_and_says_where(auth: AuthSetup, caplog: pytest.LogCaptureFixture) -> None:
    templates = _templates(auth, "a1")
    authority = CiAuthority(_Files(_config(auth)))
    job = auth.job_token("acme/app", environment="review/x")
    namespace = f"{environment_slug('review/x')}-11-1"  # the built-in template's
    assert (await _authorize(authority, f"Bearer ci:1:{job}")).namespace == namespace
    bad = templates / "default.yaml"
    bad.write_text("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: '{{ .environment.nam }}'}\n")
    assert not await authority.reload("test")
    assert f"{bad}:4:22: objects[0].metadata.name: '{{{{ .environment.nam }}}}': unknown variable" in caplog.text
    assert (await _authorize(authority, f"Bearer ci:1:{job}")).namespace == namespace


async def test_a_template_added_is_read_by_the_watch_and_replaces_the_builtin(auth: AuthSetup) -> None:
    templates = _templates(auth, "a1")
    files = _Files(_config(auth))
    authority = CiAuthority(files)
    job = auth.job_token("acme/app", job_id=3, environment="review/x")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch, 0.02)
        (templates / "default.yaml").write_text(
            "objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: 'app-{{ .ci_job.id }}'}\n"
            "delete_resources: never\n")
        with trio.fail_after(5):
            await authority.wait_reloaded()
        nursery.cancel_scope.cancel()
    grant = await _authorize(authority, f"Bearer ci:1:{job}")
    assert grant.namespace == "app-3"
    assert grant.managed is not None and grant.managed.delete_resources == "never"
    assert [o["metadata"]["name"] for o in grant.managed.objects] == ["app-3"]
    # the kubeconfig's context selects it too (GET /api/v4/job/allowed_agents)
    _, allowed = authority.snapshot.allowed_agents(job, now=time.time())
    assert [v.namespace for v in allowed if v.agent_id == 1] == ["app-3"]


async def test_a_bad_new_template_fixed_in_place_is_read_by_the_watch(auth: AuthSetup) -> None:
    # The failed load never listed the new file; the watch still sees it change (the directory's
    # stamp covers its entries).
    templates = _templates(auth, "a1")
    files = _Files(_config(auth))
    failed = trio.Event()

    def load() -> LoadedAuthorization:
        try:
            return files()
        except LoadError:
            trio.from_thread.run_sync(failed.set)  # (loads run in a worker thread)
            raise

    authority = CiAuthority(load)
    job = auth.job_token("acme/app", job_id=4, environment="review/x")
    path = templates / "default.yaml"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch, 0.02)
        path.write_text("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: {{ .ci_job.id }}}\n")
        with trio.fail_after(5):
            await failed.wait()
        with path.open("w") as handle:  # in place: same inode, the directory's mtime unchanged
            handle.write("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: 'fixed-{{ .ci_job.id }}'}\n")
        with trio.fail_after(5):
            await authority.wait_reloaded()
        nursery.cancel_scope.cancel()
    assert (await _authorize(authority, f"Bearer ci:1:{job}")).namespace == "fixed-4"


#: 10 levels of ten: 10¹⁰ strings once expanded, from ~700 bytes
BOMB = ("objects:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: x}\n    x0: &a0 [lol, lol]\n"
        + "".join(f"    x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 11)))


async def test_a_bomb_dropped_into_a_running_kasd_costs_one_failed_reload(
        auth: AuthSetup, caplog: pytest.LogCaptureFixture) -> None:
    """The reload reads in a worker thread: while it reads, the event loop goes on authorizing
    requests (shown by a load that waits for this test's task to let it go on); the bomb is refused
    by the YAML budget; the previous configuration stays in force and the failure is counted."""
    templates = _templates(auth, "a1")
    files = _Files(_config(auth))
    reading, release = threading.Event(), threading.Event()
    blocked: list[bool] = []

    def load() -> LoadedAuthorization:
        if files.loads:  # a reload: wait until a task on the event loop lets it go on
            reading.set()
            blocked.append(not release.wait(5))
        return files()

    metrics = Metrics(TunnelRegistry())
    authority = CiAuthority(load, metrics)
    job = auth.job_token("acme/app", environment="review/x")
    namespace = f"{environment_slug('review/x')}-11-1"
    (templates / "default.yaml").write_text(BOMB)
    results: list[bool] = []
    async with trio.open_nursery() as nursery:
        async def reload() -> None:
            results.append(await authority.reload("test"))

        nursery.start_soon(reload)
        await trio.to_thread.run_sync(reading.wait, abandon_on_cancel=True)
        # the reload is reading; requests are still answered (a full check: nothing remembered yet)
        assert (await _authorize(authority, f"Bearer ci:1:{job}")).namespace == namespace
        release.set()
    assert results == [False] and blocked == [False]
    path = templates / "default.yaml"
    assert f"{path}:" in caplog.text and "more than 100000 YAML nodes once aliases are expanded" in caplog.text
    assert "the previous configuration stays in force" in caplog.text
    assert (await _authorize(authority, f"Bearer ci:1:{auth.job_token('acme/app', job_id=9, environment='review/x')}")
            ).namespace == namespace
    assert _sample(metrics, "kasd_authz_config_ok") == 0
    assert _sample(metrics, "kasd_authz_reloads_total", result="failed") == 1


async def test_a_load_past_the_time_limit_fails_and_a_cancel_ends_one_at_once(
        auth: AuthSetup, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    """A load that never ends (a hung file system) costs one failed reload after LOAD_TIME_LIMIT; a
    reload in progress is cancelled at once (SIGTERM does not wait for the thread)."""
    files = _Files(_config(auth))
    release = threading.Event()

    def load() -> LoadedAuthorization:
        if files.loads:
            release.wait(30)
        return files()

    metrics = Metrics(TunnelRegistry())
    authority = CiAuthority(load, metrics)
    try:
        assert not await authority.reload("test")
        assert "reading the configuration took longer than 10 s" in caplog.text
        assert _sample(metrics, "kasd_authz_config_ok") == 0
        with trio.move_on_after(1) as scope:
            await authority.reload("test")
        assert scope.cancelled_caught
    finally:
        release.set()
    assert (await _authorize(authority, f"Bearer ci:1:{auth.job_token('acme/app')}")).agent_id == 1


async def test_sighup_asks_the_watch_to_reload(auth: AuthSetup) -> None:
    files = _Files(_config(auth))
    authority = CiAuthority(files)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authority.watch, 60.0)
        authority.request_reload("SIGHUP")
        with trio.fail_after(5):
            await authority.wait_reloaded()
        nursery.cancel_scope.cancel()
    assert files.loads == 2 and authority.generation == 2


async def test_a_config_yaml_symlinked_to_a_secret_is_refused_and_the_secret_never_logged(
        auth: AuthSetup, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = _Files(_config(auth))
    authority = CiAuthority(files)
    secret = tmp_path / "cluster-token"
    secret.write_text("eyJhbGciOiJSUzI1NiJ9.s3cr3t-cluster-token\n")
    config_yaml = auth.agent_config("acme/infra", "a1", APP_ONLY)
    config_yaml.unlink()
    config_yaml.symlink_to(secret)
    assert not await authority.reload("test")
    assert f"{config_yaml}: refused: its real path is outside its config project" in caplog.text
    assert "s3cr3t" not in caplog.text and "eyJhbGci" not in caplog.text
    assert (await _authorize(authority, f"Bearer ci:1:{auth.job_token('acme/app')}")).agent_id == 1
