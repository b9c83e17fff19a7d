"""Environments end to end: CI jobs with an environment deploy through the tunnel with real kubectl,
and kasd's REST API (``/api/kasd/v1/environments/:id/resources``, its SSE watch, GitLab's list, the
deployment history) and ``kasctl env status|list|stop`` show each state as kubesim's controllers
move the objects: a rollout Progressing → Healthy (``kubesim.io/ready-after``), a crash-looping
Deployment Degraded once its progress deadline passes, a suspended CronJob Suspended, an image that
cannot be pulled Degraded. One stack for the module; each environment is deployed once, up front,
so their clocks (the progress deadline) run together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from kasctl.restclient import rest_events, rest_json
from kasctl.stack import AGENT_ID, CONFIG_PROJECT, DEMO_USER, Stack
from kasd.authz.slugs import environment_slug
from tests.e2e.conftest import KUBECTL_CAP, KUBECTLS, LineReader
from tests.forkrun import run_module

pytestmark = pytest.mark.timeout(60)

KUBECTL = KUBECTLS[-1][1]
PROJECT_ID = 1  # group/demo, the demo agent's own project (its jobs are cluster-admin in kubesim)
#: seconds any one wait for kasd (the recorder, a graph event) may take
WAIT = 20.0


# ---------------------------------------------------------------------------------------- helpers


def labels(environment: str) -> dict[str, str]:
    return {"app.gitlab.com/project_id": str(PROJECT_ID), "app.gitlab.com/environment_slug": environment_slug(environment)}


def deployment(environment: str, name: str, annotations: Mapping[str, str], *, image: str = "nginx",
               progress_deadline: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name, **labels(environment)}, "annotations": dict(annotations)},
                     "spec": {"containers": [{"name": "web", "image": image}]}}}
    if progress_deadline is not None:
        spec["progressDeadlineSeconds"] = progress_deadline
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels(environment)},
            "spec": spec}


def service(environment: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels(environment)},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}


def cronjob(environment: str, name: str) -> dict[str, Any]:
    template = {"metadata": {"labels": labels(environment)},
                "spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "labels": labels(environment)},
            "spec": {"schedule": "0 3 * * *", "suspend": True, "jobTemplate": {"spec": {"template": template}}}}


def pod(environment: str, name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels(environment)},
            "spec": {"containers": [{"name": "app", "image": image}]}}


def configmap(environment: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels(environment)},
            "data": {"greeting": "hello"}}


class Job:
    """A CI job of group/demo in ``environment``: its kubeconfig (every replica's context) acts as
    the job (``ci:<agent>:<job token>``), so kasd records what it deploys."""

    def __init__(self, stack: Stack, environment: str, job_id: int, *, tier: str | None = None) -> None:
        self.stack, self.environment, self.job_id = stack, environment, job_id
        token = stack.auth.job_token(CONFIG_PROJECT, job_id=job_id, pipeline_id=100 + job_id, user=DEMO_USER,
                                     ref="main", environment=environment, environment_tier=tier)
        config = yaml.safe_load(stack.kubeconfig.read_text())
        for user in config["users"]:
            user["user"]["token"] = f"ci:{AGENT_ID}:{token}"
        self.kubeconfig = stack.dir / f"job-{job_id}.kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        os.chmod(self.kubeconfig, 0o600)

    def kubectl(self, *args: str, stdin: str | None = None, replica: int = 0) -> str:
        context = ["--context", self.stack.context_of(replica)]
        result = subprocess.run([KUBECTL, "--kubeconfig", str(self.kubeconfig), *context, *args],
                                              input=stdin, capture_output=True, text=True, timeout=KUBECTL_CAP)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout

    def deploy(self, namespace: str, *objects: Mapping[str, Any], replica: int = 0) -> None:
        """One ``kubectl apply``: the namespace, then the objects in it."""
        placed = [{**obj, "metadata": {**obj["metadata"], "namespace": namespace}} for obj in objects]
        manifest = yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                                       *placed])  # (not a List: kubesim serves no protobuf OpenAPI v2)
        self.kubectl("apply", "-f", "-", stdin=manifest, replica=replica)


def api_url(stack: Stack, replica: int = 0) -> str:
    return f"https://{stack.replica_addresses[replica]['api']}"


def get(stack: Stack, path: str, *, replica: int = 0) -> Any:
    return rest_json(api_url(stack, replica), path, stack.personal_token, stack.ca_file.read_bytes(),
                     token_header="PRIVATE-TOKEN")


def recorded(stack: Stack, environment: str, ready: Callable[[Mapping[str, Any]], bool] = lambda env: True,
             *, replica: int = 0) -> Mapping[str, Any]:
    """GitLab's JSON of the demo project's environment ``environment`` once ``ready`` says so: the
    recorder writes off the request's path, so this asks again until then (bounded)."""
    deadline = time.monotonic() + WAIT
    while True:
        found = get(stack, f"/api/v4/projects/{PROJECT_ID}/environments?name={quote(environment, safe='')}",
                    replica=replica)
        if found and ready(found[0]):
            return found[0]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"not recorded as wanted: {found}"
        time.sleep(0.05)  # kasd's store says nothing when it writes: asked again, briefly


def graph_events(stack: Stack, env_id: int, *, replica: int = 0) -> Generator[Mapping[str, Any]]:
    """The graphs of the environment's SSE watch, as they come (each read waits at most WAIT)."""
    for event, data in rest_events(api_url(stack, replica), f"/api/kasd/v1/environments/{env_id}/resources/watch",
                                   stack.personal_token, stack.ca_file.read_bytes(), read_timeout=WAIT):
        if event == "graph":
            yield json.loads(data)


def graph_when(stack: Stack, env_id: int, ready: Callable[[Mapping[str, Any]], bool], *,
               replica: int = 0) -> Mapping[str, Any]:
    """The first graph of the live watch for which ``ready`` holds (an event, no polling)."""
    deadline = time.monotonic() + WAIT
    seen: list[Any] = []
    for graph in graph_events(stack, env_id, replica=replica):
        if ready(graph):
            return graph
        seen.append(graph["health"])
        assert time.monotonic() < deadline, f"no such graph within {WAIT}s; saw {seen}"
    raise AssertionError(f"the watch ended; saw {seen}")


def node(graph: Mapping[str, Any], node_id: str) -> Mapping[str, Any]:
    found = [n for n in graph["nodes"] if n["id"] == node_id]
    assert found, (node_id, [n["id"] for n in graph["nodes"]])
    return found[0]  # type: ignore[no-any-return]


def status(graph: Mapping[str, Any], node_id: str | None = None) -> str:
    return str((node(graph, node_id) if node_id else graph)["health"]["status"])


def kasctl_env(stack: Stack, *args: str, replica: int = 0) -> Any:
    env = {"KASCTL_TOKEN": stack.personal_token, "KASCTL_API_URL": api_url(stack, replica),
           "KASCTL_CA_FILE": str(stack.ca_file), "PATH": "/usr/bin:/bin"}
    return run_module("kasctl", "env", *args, env=env, timeout=30)


# ---------------------------------------------------------------------------------------- the stack

ENVIRONMENTS = {  # name: (job id, namespace)
    "production": (11, "env-prod"),
    "crashing": (12, "env-crash"),
    "nightly": (13, "env-cron"),
    "broken": (14, "env-pull"),
    "live": (15, "env-live"),
    "patient": (16, "env-patient"),
}


@pytest.fixture(scope="module")
def deployed(stack: Stack) -> dict[str, int]:
    """Every environment of the module deployed by its CI job; their ids."""
    objects: dict[str, list[dict[str, Any]]] = {
        # Ready only after an hour: rolling out until the test shortens the delay.
        "production": [deployment("production", "hello", {"kubesim.io/ready-after": "1h"}),
                       service("production", "hello")],
        "crashing": [deployment("crashing", "crashy", {"kubesim.io/crash-loop": "true"}, progress_deadline=1)],
        "nightly": [cronjob("nightly", "report")],
        "broken": [pod("broken", "app", "registry.invalid/group/app:1.0")],
        "live": [configmap("live", "settings")],
        # the same crash loop with the default deadline (10 minutes)
        "patient": [deployment("patient", "crashy", {"kubesim.io/crash-loop": "true"})],
    }
    jobs = {name: Job(stack, name, job_id, tier="production" if name == "production" else None)
            for name, (job_id, _) in ENVIRONMENTS.items()}
    with ThreadPoolExecutor(len(jobs)) as pool:  # (each job is its own kubectl)
        for done in [pool.submit(jobs[name].deploy, namespace, *objects[name])
                     for name, (_, namespace) in ENVIRONMENTS.items()]:
            done.result()
    return {name: int(recorded(stack, name, in_namespace(ns))["id"]) for name, (_, ns) in ENVIRONMENTS.items()}


def in_namespace(namespace: str) -> Callable[[Mapping[str, Any]], bool]:
    """Recorded with its namespace (the job's writes reached the store)."""
    return lambda env: env["kubernetes_namespace"] == namespace


# ---------------------------------------------------------------------------------------- the states


def test_a_rollout_is_progressing_then_healthy_and_env_status_waits_for_it(stack: Stack, deployed: dict[str, int]) -> None:
    env_id = deployed["production"]
    answer = get(stack, f"/api/kasd/v1/environments/{env_id}/resources")
    assert answer["environment"]["name"] == "production" and answer["environment"]["namespaces"] == ["env-prod"]
    graph = answer["graph"]
    assert status(graph) == "Progressing", graph["health"]
    assert "apps/Deployment/env-prod/hello: Waiting for rollout to finish" in graph["health"]["message"]
    assert status(graph, "/Service/env-prod/hello") == "Healthy"
    (rs,) = [e["target"] for e in graph["edges"] if e["source"] == "apps/Deployment/env-prod/hello"]
    (pod_id,) = [e["target"] for e in graph["edges"] if e["source"] == rs and e["relation"] == "owns"]
    assert status(graph, pod_id) == "Progressing"
    assert {"source": "/Service/env-prod/hello", "target": pod_id, "relation": "selects"} in graph["edges"]

    plain = kasctl_env(stack, "status", "--project", CONFIG_PROJECT, "--environment", "production")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("production (group/demo): Progressing — apps/Deployment/env-prod/hello"), plain.stdout
    assert "Deployment env-prod/hello" in plain.stdout and "└─ Pod env-prod/" in plain.stdout

    # --wait follows the live graph, printing progress, until the rollout is done: the test makes
    # the pods Ready after a second once it has seen kasctl waiting.
    waiting = LineReader([sys.executable, "-m", "kasctl", "env", "status", "--project", CONFIG_PROJECT,
                          "--environment", "production", "--wait", "--timeout", "1m"],
                         env={**os.environ, "KASCTL_TOKEN": stack.personal_token, "KASCTL_API_URL": api_url(stack),
                              "KASCTL_CA_FILE": str(stack.ca_file)}, merge_stderr=True)
    try:
        line = waiting.wait_for("waiting for production:", timeout=WAIT)
        assert "Progressing — apps/Deployment/env-prod/hello: Waiting for rollout to finish" in line, line
        Job(stack, "production", 21, tier="production").kubectl(
            "-n", "env-prod", "patch", "deployment", "hello", "--type=merge",
            "-p", json.dumps({"spec": {"template": {"metadata": {"annotations": {"kubesim.io/ready-after": "1s"}}}}}))
        waiting.wait_for("production (group/demo): Healthy", timeout=WAIT)
        assert waiting.proc.wait(WAIT) == 0, waiting.seen
    finally:
        waiting.stop()
    healthy = get(stack, f"/api/kasd/v1/environments/{env_id}/resources")["graph"]
    assert status(healthy) == "Healthy" and healthy["health"]["message"] == ""
    assert status(healthy, "apps/Deployment/env-prod/hello") == "Healthy"


def test_a_crash_looping_deployment_is_degraded_once_its_progress_deadline_passes(
        stack: Stack, deployed: dict[str, int]) -> None:
    env_id = deployed["crashing"]
    graph = graph_when(stack, env_id, lambda g: g["health"]["status"] == "Degraded")
    assert graph["health"]["message"] == ('apps/Deployment/env-crash/crashy: Deployment "crashy" exceeded its '
                                          'progress deadline')
    pods = [n for n in graph["nodes"] if n["kind"] == "Pod"]
    assert len(pods) == 1 and pods[0]["health"]["status"] == "Degraded", pods
    message = pods[0]["health"]["message"]  # waiting in its back-off, or between two crashes
    assert "restarting failed container=web" in message or 'container "web" last terminated' in message, message

    plain = kasctl_env(stack, "status", "--project", CONFIG_PROJECT, "--environment", "crashing")
    assert plain.returncode == 1, plain.stderr
    assert plain.stdout.startswith("crashing (group/demo): Degraded"), plain.stdout
    as_json = kasctl_env(stack, "status", "--project", CONFIG_PROJECT, "--environment", "crashing", "-o", "json")
    assert as_json.returncode == 1, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer["graph"]["health"]["status"] == "Degraded" and answer["environment"]["id"] == env_id
    assert status(answer["graph"], pods[0]["id"]) == "Degraded"


def test_a_crash_looping_pod_leaves_its_deployment_progressing_until_the_deadline(
        stack: Stack, deployed: dict[str, int]) -> None:
    """The roll-up judges the roots, as Argo CD does: the pod's own badge is Degraded, the
    Deployment (and so the environment) Progressing until its progress deadline passes."""
    graph = graph_when(stack, deployed["patient"], lambda g: any(
        n["kind"] == "Pod" and n["health"]["status"] == "Degraded" for n in g["nodes"]))
    assert status(graph) == "Progressing" and status(graph, "apps/Deployment/env-patient/crashy") == "Progressing"
    plain = kasctl_env(stack, "status", "--project", CONFIG_PROJECT, "--environment", "patient")
    assert plain.returncode == 0, plain.stderr  # not Degraded (yet)
    assert plain.stdout.startswith("patient (group/demo): Progressing"), plain.stdout


def test_a_suspended_cronjob_is_suspended(stack: Stack, deployed: dict[str, int]) -> None:
    graph = get(stack, f"/api/kasd/v1/environments/{deployed['nightly']}/resources")["graph"]
    assert graph["health"] == {"status": "Suspended", "message": "batch/CronJob/env-cron/report: CronJob is Suspended"}
    assert [n["id"] for n in graph["nodes"]] == ["batch/CronJob/env-cron/report"]
    plain = kasctl_env(stack, "status", "--project", CONFIG_PROJECT, "--environment", "nightly")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[1].split() == ["CronJob", "env-cron/report", "Suspended", "CronJob", "is",
                                                    "Suspended"]


def test_an_image_that_cannot_be_pulled_is_degraded(stack: Stack, deployed: dict[str, int]) -> None:
    graph = get(stack, f"/api/kasd/v1/environments/{deployed['broken']}/resources")["graph"]
    assert status(graph) == "Degraded", graph["health"]
    message = node(graph, "/Pod/env-pull/app")["health"]["message"]
    assert 'failed to pull and unpack image "registry.invalid/group/app:1.0"' in message, message
    as_json = kasctl_env(stack, "status", "--project", CONFIG_PROJECT, "--environment", "broken", "-o", "json")
    assert as_json.returncode == 1, as_json.stderr
    assert json.loads(as_json.stdout)["graph"]["health"]["status"] == "Degraded"


def test_a_change_in_the_cluster_reaches_a_watcher_as_a_graph_event(stack: Stack, deployed: dict[str, int]) -> None:
    events = graph_events(stack, deployed["live"])
    first = next(events)  # the watch starts with the whole graph
    assert [n["id"] for n in first["nodes"]] == ["/ConfigMap/env-live/settings"]
    Job(stack, "live", 22).kubectl("apply", "-n", "env-live", "-f", "-", stdin=yaml.safe_dump(service("live", "web")))
    deadline = time.monotonic() + WAIT
    for graph in events:
        if "/Service/env-live/web" in {n["id"] for n in graph["nodes"]}:
            break
        assert time.monotonic() < deadline
    events.close()


# ---------------------------------------------------------------------------------------- GitLab's view


def test_gitlabs_list_history_and_a_stop(stack: Stack, deployed: dict[str, int]) -> None:
    listed = {e["name"]: e for e in get(stack, f"/api/v4/projects/{PROJECT_ID}/environments")}
    prod = listed["production"]
    assert prod["id"] == deployed["production"]
    assert {k: prod[k] for k in ("slug", "state", "tier", "external_url", "kubernetes_namespace", "cluster_agent")} == {
        "slug": "production", "state": "available", "tier": "production", "external_url": None,
        "kubernetes_namespace": "env-prod", "cluster_agent": {"id": AGENT_ID}}
    assert set(prod) >= {"id", "name", "slug", "external_url", "state", "tier", "created_at", "updated_at"}
    by_path = get(stack, f"/api/v4/projects/{quote(CONFIG_PROJECT, safe='')}/environments/{prod['id']}")
    assert by_path["last_deployment"]["deployable"]["id"] in (11, 21)  # the last job that wrote to it

    history = get(stack, f"/api/kasd/v1/environments/{deployed['broken']}/deployments")
    assert [(d["job_id"], d["pipeline_id"], d["user"], d["ref"], d["agent_id"], d["namespaces"]) for d in history] == [
        (14, 114, DEMO_USER, "main", AGENT_ID, ["env-pull"])]

    listing = kasctl_env(stack, "list", "--project", CONFIG_PROJECT)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    assert rows["nightly"][1:4] == ["-", "available", "Suspended"], listing.stdout
    assert rows["broken"][3] == "Degraded", listing.stdout

    # The stop job stops it (there is nothing kasd made for it to delete here).
    stop_token = stack.auth.job_token(CONFIG_PROJECT, job_id=31, pipeline_id=113, user=DEMO_USER,
                                      environment="nightly")
    stopped = run_module("kasctl", "env", "stop", timeout=30, env={
        "CI_JOB_TOKEN": stop_token, "CI_PROJECT_PATH": CONFIG_PROJECT, "CI_ENVIRONMENT_NAME": "nightly",
        "KASCTL_API_URL": api_url(stack), "KASCTL_CA_FILE": str(stack.ca_file), "PATH": "/usr/bin:/bin"})
    assert stopped.returncode == 0, stopped.stderr
    assert [e["name"] for e in get(stack, f"/api/v4/projects/{PROJECT_ID}/environments?states=stopped")] == ["nightly"]
    after = kasctl_env(stack, "list", "--project", CONFIG_PROJECT)
    assert next(line.split() for line in after.stdout.splitlines() if line.startswith("nightly"))[2] == "stopped"
