"""agentd's annotate action against kubesim serving Flux's CRDs, through ``run_agent`` (so the
``event`` kind is wired into agentd's streams): a fake kasd opens event streams on agentd's tunnel."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from agentd.events.settings import AnnotateSettings, EventsSettings, HandlerSettings
from agentd.kubeapi import kubeconfig_target
from kubesim.server import open_kubesim
from tests.agentd.harness import (
    EVENT_POSTED_AT,
    SIM_TOKEN,
    agent_config,
    event_metadata,
    exchange,
    head,
    running_agent,
    send_event,
    start_fake_kasd,
)
from tests.trusted import TRUSTED

pytestmark = pytest.mark.timeout(20)

REPO = Path(__file__).resolve().parents[2]
FLUX_CRDS = tuple(yaml.safe_load_all((REPO / "examples" / "manifests" / "flux-crds.yaml").read_text()))
APP_URL = "https://gitlab.example.com/group/app.git"
GITREPOS = "/apis/source.toolkit.fluxcd.io/v1/namespaces/flux-system/gitrepositories"


def git_repository(name: str, url: str) -> dict[str, Any]:
    return {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
            "metadata": {"name": name, "namespace": "flux-system"},
            "spec": {"interval": "5m", "url": url, "ref": {"branch": "main"}}}


OBJECTS = (*TRUSTED, *FLUX_CRDS, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "flux-system"}},
           git_repository("app", APP_URL), git_repository("app-staging", APP_URL),
           git_repository("other", "https://gitlab.example.com/group/other.git"))


def annotate(event_type: str, **fields: Any) -> HandlerSettings:
    values: dict[str, Any] = {"api_version": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                              "namespace": "flux-system"}
    values.update(fields)
    return HandlerSettings(type=event_type, annotate=AnnotateSettings(**values))


HANDLERS = (
    annotate("sync", name="app"),
    annotate("push", match="url"),
    annotate("gone", name="deleted-long-ago"),
    annotate("kustomize", api_version="kustomize.toolkit.fluxcd.io/v1", kind="Kustomization", name="apps"),
)


async def test_annotate_sets_flux_s_requested_at_by_name_and_by_url(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=OBJECTS, token=SIM_TOKEN, bookmark_interval=3600) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url, events=EventsSettings(retry_for=2, handlers=HANDLERS))
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
            session = await kasd.session()

            async def requested_at() -> dict[str, str | None]:
                response, body = await exchange(session, head("GET", GITREPOS))
                assert response.status == 200
                return {item["metadata"]["name"]: (item["metadata"].get("annotations") or {}).get(
                    "reconcile.fluxcd.io/requestedAt") for item in json.loads(body)["items"]}

            posted = datetime.datetime.fromtimestamp(EVENT_POSTED_AT, datetime.UTC)
            expected = posted.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            assert expected.endswith(".250000Z")

            answer = await send_event(session, event_metadata("e-1", event_type="sync"))
            assert answer["outcome"] == "done" and answer["status"] == 200
            assert await requested_at() == {"app": expected, "app-staging": None, "other": None}

            later = event_metadata("e-2", event_type="push", posted_at=EVENT_POSTED_AT + 60)
            answer = await send_event(session, later, json.dumps({"url": APP_URL}).encode())
            assert answer["outcome"] == "done", answer
            assert "annotated 2 GitRepository in flux-system (app, app-staging)" in answer["detail"]
            in_a_minute = (posted + datetime.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            assert await requested_at() == {"app": in_a_minute, "app-staging": in_a_minute, "other": None}

            # the payload's url picks among the configured kind and namespace only; none matches here
            answer = await send_event(session, event_metadata("e-3", event_type="push"),
                                      json.dumps({"url": "https://elsewhere/x.git"}).encode())
            assert answer["outcome"] == "failed"
            assert "no GitRepository in flux-system has spec.url 'https://elsewhere/x.git'" in answer["detail"]

            started = trio.current_time()
            answer = await send_event(session, event_metadata("e-4", event_type="gone"))
            assert answer == {"outcome": "failed", "status": 404,
                              "detail": "annotate: GitRepository flux-system/deleted-long-ago not found (404)"}
            assert trio.current_time() - started < 1  # not retried: it would not appear by itself

            # a Kustomization: the same merge patch on another Flux kind
            await exchange(session, head("POST", "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations",
                                         headers=(("content-type", "application/json"),)),
                           json.dumps({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                                       "metadata": {"name": "apps", "namespace": "flux-system"},
                                       "spec": {"interval": "10m", "path": "./apps", "prune": True}}).encode())
            answer = await send_event(session, event_metadata("e-5", event_type="kustomize"))
            assert answer["outcome"] == "done", answer
            _, body = await exchange(
                session, head("GET", "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/apps"))
            annotations = json.loads(body)["metadata"]["annotations"]
            assert annotations == {"reconcile.fluxcd.io/requestedAt": expected}
            # agentd patched with its own credentials, not as anyone kasd named
            patches = [r for r in sim.requests if r.method == "PATCH"]
            assert patches and all(r.bearer_token == SIM_TOKEN and not r.impersonate for r in patches)
