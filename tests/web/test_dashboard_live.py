"""The dashboard in a real browser (Debian's chromium, playwright) against the real product: one
stack (kubesim, kasd, agentd as processes, ``kasctl.stack.Stack``) for the module. A CI job of
group/demo with environment ``production`` deploys through the tunnel with real kubectl; the demo
user signs in with a personal token, opens the environment, sees the graph turn from Progressing to
Healthy without a reload, follows a pod's logs while the test writes to the container, deletes a pod
and sees its replacement; the Reporter is refused the objects in GitLab's words; a cookie POST
without the CSRF token is refused. The tests run in order and carry the page on.

The fake-API tests (test_dashboard_browser.py) cover the dashboard's own corner cases; this module
is for what only the real thing shows. Screenshots are kept under pytest's temporary directory
(``dashboard-live*``); ``KASD_DASHBOARD_SCREENSHOTS=docs/images`` copies the two docs/environments.md
shows there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kasctl.stack import CONFIG_PROJECT, Stack, find_kubectl
from tests.e2e.conftest import module_stack
from tests.web.browser import CHROMIUM, FLAGS, needs_browser

pytestmark = [pytest.mark.e2e, needs_browser, pytest.mark.timeout(90)]

LABELS = '{app: hello, app.gitlab.com/project_id: "1", app.gitlab.com/environment_slug: production}'
NAMESPACE = "live"
#: the first step of the job: the namespace and the Service (the environment exists from here on)
SERVICE = f"""\
apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: Service
metadata:
  name: hello
  namespace: {NAMESPACE}
  labels: {LABELS}
spec:
  selector: {{app: hello}}
  ports: [{{name: http, port: 80, targetPort: 80}}]
"""
#: the second step, while the page watches: a Deployment whose pods are Ready 4 s after they start
#: (kubesim's stand-in for a readiness probe), so its rollout is visibly Progressing
DEPLOYMENT = f"""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
  namespace: {NAMESPACE}
  labels: {LABELS}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: hello}}
  template:
    metadata:
      labels: {LABELS}
      annotations: {{kubesim.io/ready-after: 4s}}
    spec:
      containers:
        - name: hello
          image: nginx:1.27
          stdin: true          # the test writes a log line through `kubectl attach -i`
          ports: [{{containerPort: 80}}]
"""
KUBECTL_CAP = 20  # seconds any one kubectl call may take


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from module_stack(tmp_path_factory)


class Job:
    """A CI job of group/demo deploying to ``production``: real kubectl, the job's own token."""

    def __init__(self, stack: Stack) -> None:
        kubectl = find_kubectl()
        assert kubectl is not None, "no kubectl"
        self.kubectl = kubectl
        self.stack = stack
        token = stack.auth.job_token(CONFIG_PROJECT, job_id=7, pipeline_id=7, environment="production",
                                     environment_tier="production")
        self.token = f"ci:1:{token}"

    def args(self, *args: str) -> list[str]:
        return [self.kubectl, "--kubeconfig", str(self.stack.kubeconfig), "--token", self.token, *args]

    def run(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(self.args(*args), input=stdin, capture_output=True, text=True, timeout=KUBECTL_CAP)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def job(stack: Stack) -> Job:
    job = Job(stack)
    job.run("apply", "-f", "-", stdin=SERVICE)
    return job


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Screenshots, kept as test artifacts."""
    return tmp_path_factory.mktemp("dashboard-live")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


def new_page(browser: Any, errors: list[str]) -> Any:
    """A fresh context (cookies of its own) at 1280×800, trusting the stack's throwaway CA; what goes
    wrong in it (script errors, failed or refused requests, CSP reports) is added to ``errors``."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, ignore_https_errors=True)
    context.set_default_timeout(10_000)
    tab = context.new_page()
    tab.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    tab.on("response", lambda r: errors.append(f"{r.status} for {r.request.method} {r.url}") if r.status >= 400 else None)
    tab.on("requestfailed", lambda r: None if _streamed_to_the_end(r) else errors.append(f"{r.failure} for {r.method} {r.url}"))
    tab.on("console", lambda m: errors.append(f"console: {m.text} ({m.location.get('url')})") if m.type == "error" else None)
    return tab


def _streamed_to_the_end(request: Any) -> bool:
    """Chromium reports a no-store fetch whose stream the page read to its end as failed
    (net::ERR_ABORTED; microsoft/playwright#42742): a pod's log that ended with its container. The
    page's own "ended" state is what the test checks."""
    return request.failure == "net::ERR_ABORTED" and "/log?follow=true" in request.url


@pytest.fixture(scope="module")
def errors() -> list[str]:
    return []


@pytest.fixture(scope="module")
def page(browser: Any, stack: Stack, errors: list[str]) -> Iterator[Any]:
    tab = new_page(browser, errors)
    yield tab
    tab.context.close()
    assert errors == [], "\n".join(errors)


def keep(page: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / name))
    wanted = os.environ.get("KASD_DASHBOARD_SCREENSHOTS")
    if wanted:
        shutil.copy(shots / name, Path(wanted) / name)


def sign_in(page: Any, stack: Stack, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{stack.api_url}/-/dashboard/")
    page.get_by_label("Personal access token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    # signed in: the agents page, a table of those one may see (a Reporter sees none)
    expect(page.get_by_role("table", name="Connected agents").or_(page.get_by_text("You see no agent"))).to_be_visible()


def go(page: Any, fragment: str) -> None:
    page.evaluate("(f) => { location.hash = f; }", fragment)


def pod_names(page: Any) -> set[str]:
    ids: list[str] = page.evaluate("globalThis.kasdDashboard.cy().nodes('[kind = \"Pod\"]').map((n) => n.id())")
    return {i.rsplit("/", 1)[1] for i in ids}


STATE: dict[str, Any] = {}


def test_sign_in_and_watch_the_rollout_turn_healthy(page: Any, stack: Stack, job: Job, shots: Path) -> None:
    from playwright.sync_api import expect

    sign_in(page, stack, stack.personal_token)
    expect(page.get_by_role("table", name="Connected agents")).to_contain_text("demo")
    go(page, "#/environments?group=group&tier=production")  # every production environment of the group
    row = page.get_by_role("table", name="Environments").get_by_role("row", name=re.compile(r"^production "))
    expect(row).to_contain_text(f"production {CONFIG_PROJECT} production available Healthy", use_inner_text=True)
    asked: list[str] = []

    def ask(request: Any) -> None:
        asked.append(urlsplit(request.url).path)

    page.on("request", ask)
    row.get_by_role("link", name="production").click()
    page.wait_for_url(re.compile(r"#/environments/\d+"))
    STATE["env"] = env = int(re.search(r"#/environments/(\d+)", page.url).group(1))  # type: ignore[union-attr]
    expect(page.get_by_role("navigation", name="Resource tree")).to_contain_text("Service live/hello")
    expect(page.get_by_role("region", name="Deployments")).to_contain_text("main demo 7 7 1 live", use_inner_text=True)
    # the page lists the environment's objects through the agent once (and watches), not once more for its health
    base = f"/api/kasd/v1/environments/{env}"
    page.remove_listener("request", ask)
    assert sorted(p for p in asked if p.startswith(base)) == [base + "/deployments", base + "/resources", base + "/resources/watch"], asked
    # every health the badge shows from now on, in order (the test itself may look too late to see one)
    page.evaluate("""() => {
        window.__samePage = true;
        const badge = document.querySelector("#env-health");
        window.__healths = [badge.textContent];
        new MutationObserver(() => window.__healths.push(badge.textContent))
            .observe(badge, {childList: true, subtree: true, characterData: true});
    }""")

    job.run("apply", "-f", "-", stdin=DEPLOYMENT)
    badge = page.locator("#env-health")
    page.wait_for_function("() => globalThis.kasdDashboard.cy().nodes('[kind = \"Pod\"]').length === 2")
    kinds = page.evaluate("globalThis.kasdDashboard.cy().nodes().map((n) => n.data('kind')).sort()")
    assert {"Deployment", "ReplicaSet", "Pod", "Service"} <= set(kinds), kinds
    drawn, listed = page.evaluate("""() => [  // (at one moment: an update may come between two calls)
        globalThis.kasdDashboard.cy().nodes().map((n) => n.id()).sort(),
        [...document.querySelectorAll("nav.tree button.node")].map((b) => b.dataset.id).sort()]""")
    assert drawn == listed, (drawn, listed)  # the graph draws what the tree lists
    assert page.evaluate("globalThis.kasdDashboard.cy().$id('apps/Deployment/live/hello').outgoers('edge').length") == 1
    # the health line at the top, the tree and the whole graph in one 1280×800 picture
    page.evaluate("window.scrollTo(0, document.querySelector('#env-health').getBoundingClientRect().top + scrollY - 16)")
    keep(page, shots, "environment-graph.png")

    expect(badge).to_have_text("Healthy", timeout=15_000)
    page.wait_for_function("() => globalThis.kasdDashboard.cy().$id('apps/Deployment/live/hello').data('status') === 'Healthy'")
    assert page.evaluate("window.__samePage") is True, "the page was reloaded"
    shown: list[str] = page.evaluate("window.__healths")
    changes = [h for i, h in enumerate(shown) if i == 0 or h != shown[i - 1]]
    assert changes[0] == "Healthy" and changes[-2:] == ["Progressing", "Healthy"], changes  # (the Service alone: Healthy)


def test_follow_a_pods_logs_while_the_container_writes(page: Any, job: Job, shots: Path) -> None:
    from playwright.sync_api import expect

    pod = sorted(pod_names(page))[0]
    STATE["pod"] = pod
    page.locator(f'button.node[data-id="/Pod/{NAMESPACE}/{pod}"]').click()
    panel = page.get_by_role("complementary", name="Selected object")
    expect(panel.get_by_role("heading", name=f"Pod {pod}")).to_be_visible()
    expect(panel.locator("pre.yaml")).to_contain_text("kind: Pod")
    assert panel.locator("pre.yaml").inner_text().startswith("apiVersion: v1\nkind: Pod\nmetadata:\n")  # as kubectl shows it
    scheduled = panel.get_by_role("table", name="Events").get_by_role("row", name=re.compile(r"^Normal Scheduled "))
    expect(scheduled).to_contain_text(f"Successfully assigned {NAMESPACE}/{pod} to ")
    expect(scheduled).to_contain_text(re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"))  # when
    expect(panel.locator("#log-container")).to_have_value("hello")
    panel.get_by_role("button", name="Follow logs").click()
    logs = panel.locator("#logs")
    expect(panel.locator(".log-state")).to_have_text("following")

    # the container's main process echoes what attach sends it: a line written now, while the page follows
    job.run("attach", "-i", "-n", NAMESPACE, pod, "-c", "hello", stdin="hello from the live test\n")
    expect(logs).to_contain_text("hello from the live test")
    keep(page, shots, "environment-logs.png")


def test_delete_a_pod_and_see_it_replaced(page: Any) -> None:
    from playwright.sync_api import expect

    pod = STATE["pod"]
    before = pod_names(page)
    panel = page.get_by_role("complementary", name="Selected object")
    panel.get_by_role("button", name="Delete pod").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"Delete pod {NAMESPACE}/{pod}?")
    dialog.get_by_role("button", name="Delete pod").click()
    expect(panel).to_contain_text(f"Pod {pod} is being deleted.")
    expect(panel.locator(".log-state")).to_have_text("ended")  # the container stopped: its log ends
    page.wait_for_function("""(old) => {
        const pods = globalThis.kasdDashboard.cy().nodes('[kind = "Pod"]').map((n) => n.id());
        return pods.length === 2 && !pods.includes(old);
    }""", arg=f"/Pod/{NAMESPACE}/{pod}")
    after = pod_names(page)
    assert pod not in after and len(after - before) == 1, (before, after)
    expect(panel.get_by_text("This object is no longer in the environment.")).to_be_visible()
    expect(page.get_by_role("navigation", name="Resource tree")).to_contain_text(next(iter(after - before)))


def test_a_cookie_post_without_the_csrf_token_is_refused(page: Any, errors: list[str]) -> None:
    path = f"/api/kasd/v1/environments/{STATE['env']}/flux/Kustomization/{NAMESPACE}/hello/reconcile"
    seen = len(errors)
    status, body = page.evaluate("""async (path) => {
        const r = await fetch(path, {method: "POST"});
        return [r.status, await r.json()];
    }""", path)
    assert status == 403
    assert "CSRF" in body["message"]
    refused = errors[seen:]
    assert refused and all("403" in e for e in refused), refused  # the 403 (and its console line), as expected
    del errors[seen:]


def test_a_reporter_is_refused_the_objects_in_gitlabs_words(browser: Any, stack: Stack) -> None:
    from playwright.sync_api import expect

    errors: list[str] = []
    guest = new_page(browser, errors)
    try:
        sign_in(guest, stack, stack.guest_token)
        expect(guest.get_by_text("You see no agent")).to_be_visible()  # agents: Developer and up, as GitLab
        go(guest, f"#/environments?project={CONFIG_PROJECT}")  # a Reporter sees the environments…
        row = guest.get_by_role("row", name=re.compile(r"^production "))
        expect(row).to_contain_text("unavailable")               # …but not their health
        row.get_by_role("link", name="production").click()
        expect(guest.get_by_role("heading", name="Access refused")).to_be_visible()
        expect(guest.get_by_role("alert")).to_have_text(
            "403 Forbidden: user guest needs at least the Developer role in a project or group that agent 1 "
            "authorizes for user access (user_access)")
        assert guest.get_by_role("navigation", name="Resource tree").count() == 0
    finally:
        guest.context.close()
    assert errors and all("403" in e for e in errors), errors
