"""The recorder in the request pipeline (fakes, memory streams, an in-memory SQLite store): a CI job
with an environment is recorded with the namespaces it wrote into, and a recorder that cannot keep
up never holds a request back."""

from __future__ import annotations

import attrs
import pytest
import trio

from kasd.authz.jobtokens import JobClaims
from kasd.authz.slugs import environment_slug
from kasd.k8sproxy.exchange import ClientRequest, Headers
from kasd.k8sproxy.pipeline import RequestPipeline
from kasd.metrics import Metrics
from kasd.seams import Credentials, Grant
from kasd.store.deployments import Deployment, DeploymentRecorder, Environment
from kasd.store.sqlite import SqliteStore
from routing.local import TunnelRegistry
from tests.kasd.test_pipeline import PLAN, FakeAuthority, FakeExchange, FakeRouter, agent_session
from tunnelhttp.head import RequestHead, ResponseHead
from wire.session import Session

pytestmark = pytest.mark.timeout(10)

JOB = JobClaims(project="group/app", job_id=7, pipeline_id=3, user="alice", ref="main", environment="review/x",
                environment_tier="development")


class JobAuthority(FakeAuthority):
    """Grants job ``<secret>`` (a number) of environment review/x, whose managed namespace is app-42."""

    async def authorize(self, credentials: Credentials, agent_id: int) -> Grant:
        self.asked.append((credentials, agent_id))
        job = attrs.evolve(JOB, job_id=int(credentials.secret))
        return Grant(kind="ci", agent_id=agent_id, impersonate=None, subject=f"ci_job:{job.job_id}",
                     environment=job.environment, managed=PLAN, job=job)


async def agent(agent_side: Session) -> None:
    """Answers each request 201, or 403 when its target says ``denied``."""
    while True:
        stream = await agent_side.accept_stream()
        head = RequestHead.from_metadata(stream.metadata)
        while await stream.receive_some():
            pass
        await stream.accept(ResponseHead(status=403 if "denied" in head.target else 201, headers=()).to_metadata())
        await stream.send_all(b"{}")
        await stream.send_eof()


def call(method: str, target: str, job: int = 7) -> ClientRequest:
    return ClientRequest(method=method, target=target, headers=(("authorization", f"Bearer ci:1:{job}"),),
                         protocol="HTTP/1.1", peer="test", has_body=method in ("POST", "PUT", "PATCH"))


async def test_a_job_with_an_environment_is_recorded_with_the_namespaces_it_wrote_into() -> None:
    store = SqliteStore.open_sync(":memory:", max_entries=10)
    written = trio.Event()

    class Counted:
        """The store, and ``written`` set once the three records expected are in."""

        async def record_deployment(self, d: Deployment) -> Environment:
            env = await store.record_deployment(d)
            if recorder.recorded == 2:
                written.set()
            return env

    # the token carries no project id: the directory's is used
    recorder = DeploymentRecorder(Counted(), project_id={"group/app": 42}.get, clock=lambda: 1_800_000_000.0)
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        nursery.start_soon(agent, agent_side)
        await nursery.start(recorder.run)
        pipeline = RequestPipeline(JobAuthority(), FakeRouter(kasd_side), Metrics(TunnelRegistry()), recorder=recorder)
        new_namespace = b'{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"fresh"}}'
        for method, target, body in [
            ("GET", "/api/v1/namespaces/app-42/pods", []),  # the first use: the managed namespace
            ("POST", "/apis/apps/v1/namespaces/web/deployments", [b"{}"]),
            ("PATCH", "/apis/apps/v1/namespaces/web/deployments/hello", [b"{}"]),  # known: nothing new
            ("POST", "/api/v1/namespaces", [new_namespace[:20], new_namespace[20:]]),  # the name is in the body
            ("POST", "/api/v1/namespaces/dry/configmaps?dryRun=All", [b"{}"]),  # writes nothing
            ("DELETE", "/api/v1/namespaces/denied/pods/p", []),  # refused by the cluster
            ("GET", "/api/v1/namespaces/read-only/pods", []),
        ]:
            ex = FakeExchange(call(method, target), nursery, body=list(body))
            with trio.fail_after(5):
                await pipeline.serve(ex)
            assert ex.status in (201, 403)
        with trio.fail_after(5):
            await written.wait()
        env = await store.environment_named(42, "review/x")
        history = await store.deployments(env.id) if env is not None else []
        nursery.cancel_scope.cancel()
    assert env is not None and (env.state, env.tier, env.agents) == ("available", "development", (1,))
    assert env.namespaces == ("app-42", "fresh", "web")
    assert history == [Deployment(project_id=42, project="group/app", environment="review/x",
                                  slug=environment_slug("review/x"), tier="development",
                                  agent_id=1, namespaces=("app-42", "fresh", "web"), job_id=7, pipeline_id=3,
                                  ref="main", user="alice", at=1_800_000_000.0)]
    assert recorder.statistics().recorded == 3 and recorder.statistics().dropped == 0
    await store.aclose()


class StuckStore:
    """A store that never answers."""

    def __init__(self) -> None:
        self.asked = 0

    async def record_deployment(self, d: Deployment) -> Environment:
        self.asked += 1
        await trio.sleep_forever()
        raise AssertionError


async def test_a_full_queue_drops_records_and_never_holds_a_request(caplog: pytest.LogCaptureFixture) -> None:
    store = StuckStore()
    outcomes: list[str] = []
    recorder = DeploymentRecorder(store, project_id={"group/app": 42}.get, queue_size=2, count=outcomes.append)
    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        nursery.start_soon(agent, agent_side)
        await nursery.start(recorder.run)
        pipeline = RequestPipeline(JobAuthority(), FakeRouter(kasd_side), Metrics(TunnelRegistry()), recorder=recorder)
        with trio.fail_after(5):  # 20 jobs' first requests, each a record, while the store hangs on the first
            for job in range(1, 21):
                ex = FakeExchange(call("POST", "/api/v1/namespaces/web/configmaps", job=job), nursery, body=[b"{}"])
                await pipeline.serve(ex)
                assert ex.status == 201 and ex.ended
        stats = recorder.statistics()
        nursery.cancel_scope.cancel()
    assert store.asked == 1 and stats.queued == 2 and stats.dropped > 0
    assert outcomes == ["dropped"] * stats.dropped  # what kasd_deployment_records_total{outcome} counts
    # one line says so, not one per dropped record
    lines = [r for r in caplog.records if "recorder's queue is full" in r.getMessage()]
    assert len(lines) == 1


async def test_a_write_is_recorded_even_when_the_client_leaves_as_soon_as_it_has_the_answer() -> None:
    """kubectl exits the moment its last write is answered; the front end then cancels the request's
    task while the pipeline still closes the tunnel stream. The write happened: it is recorded."""
    store = SqliteStore.open_sync(":memory:", max_entries=10)
    written = trio.Event()

    class Counted:
        async def record_deployment(self, d: Deployment) -> Environment:
            env = await store.record_deployment(d)
            if "last" in d.namespaces:
                written.set()
            return env

    recorder = DeploymentRecorder(Counted(), project_id={"group/app": 42}.get, clock=lambda: 1_800_000_000.0)

    @attrs.define
    class Leaving(FakeExchange):
        scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

        async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
            await super().respond(status, headers, body, end=end)
            if end:
                self.scope.cancel()  # the connection closes: the request's task is cancelled

        async def end(self) -> None:
            await super().end()
            self.scope.cancel()

    async with agent_session() as (kasd_side, agent_side), trio.open_nursery() as nursery:
        nursery.start_soon(agent, agent_side)
        await nursery.start(recorder.run)
        pipeline = RequestPipeline(JobAuthority(), FakeRouter(kasd_side), Metrics(TunnelRegistry()), recorder=recorder)
        ex = Leaving(call("POST", "/api/v1/namespaces/last/configmaps"), nursery, body=[b"{}"])
        with trio.fail_after(5), ex.scope:
            await pipeline.serve(ex)
        assert ex.status == 201 and ex.ended and ex.scope.cancelled_caught
        with trio.move_on_after(2):
            await written.wait()
        env = await store.environment_named(42, "review/x")
        nursery.cancel_scope.cancel()
    assert env is not None and env.namespaces == ("app-42", "last")
    await store.aclose()
