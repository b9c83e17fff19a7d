"""The dashboard in a real browser (chromium, playwright) against a fake kasd API
(tests/web/dashboard_fake.py): sign in, agents, an environment's graph turning Healthy live, a pod's
streamed logs, deleting a pod (with the CSRF header), Flux reconcile, a refusal, a CSRF-less POST.
One browser and one page for the module; the tests run in order and carry the session on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web.browser import CHROMIUM, FLAGS, needs_browser
from tests.web.dashboard_fake import REFUSAL, TOKEN, FakeKasd, hello_graph

pytestmark = [pytest.mark.e2e, needs_browser, pytest.mark.timeout(60)]

WATCH_PAGE = """
window.__kasdErrors = [];
document.addEventListener("securitypolicyviolation", (e) => window.__kasdErrors.push(`CSP ${e.violatedDirective} ${e.blockedURI}`));
"""


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKasd]:
    kasd = FakeKasd()
    kasd.start()
    yield kasd
    kasd.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Screenshots, kept as test artifacts (docs/environments.md shows the real product's, from
    test_dashboard_live.py)."""
    return tmp_path_factory.mktemp("dashboard-screenshots")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=FLAGS, viewport={"width": 1400, "height": 900})
        context.set_default_timeout(10_000)
        context.add_init_script(WATCH_PAGE)
        tab = context.pages[0] if context.pages else context.new_page()
        tab.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        tab.on("response", lambda r: errors.append(f"{r.status} for {r.url}")
               if "/-/dashboard/" in r.url and r.status >= 400 else None)
        yield tab
        errors += tab.evaluate("window.__kasdErrors ?? []")
        context.close()
    assert errors == [], errors


def keep(page: Any, shots: Path, name: str, **kwargs: Any) -> None:
    page.screenshot(path=str(shots / name), **kwargs)


# Every wait_for_function is given a function ("() => …"): an expression string is eval'ed inside the
# page, which the dashboard's CSP (no 'unsafe-eval') refuses as soon as the first check fails.


def go(page: Any, fragment: str) -> None:
    page.evaluate("(f) => { location.hash = f; }", fragment)


def test_sign_in_then_agents(page: Any, fake: FakeKasd) -> None:
    from playwright.sync_api import expect

    answer = page.goto(f"{fake.url}/-/dashboard/")
    assert answer.headers["content-security-policy"].startswith("default-src 'self'")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()

    page.get_by_label("Personal access token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not a valid personal access token")

    page.get_by_label("Personal access token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    agents = page.get_by_role("table", name="Connected agents")
    expect(agents).to_contain_text("prod-agent")
    expect(agents).to_contain_text("agentd-5f7c9-x2x9q (0.1.0) since 2026-11-27T09:58:00Z on replica kasd-0")
    expect(agents).to_contain_text("pod in gitlab-agent on node node-a, serving the whole cluster")
    assert page.get_by_label("Personal access token").count() == 0
    # the agent's page: what its pod found in the cluster
    agents.get_by_role("link", name="prod-agent").click()
    cluster = page.get_by_role("region", name="Cluster seen by agentd-5f7c9-x2x9q")
    expect(cluster).to_contain_text("v1.32.0 (linux/amd64)")
    expect(cluster).to_contain_text("Flux")


def test_environment_graph_turns_healthy_without_reload(page: Any, fake: FakeKasd, shots: Path) -> None:
    from playwright.sync_api import expect

    go(page, "#/environments?group=group&tier=production")  # every production environment of a group
    table = page.get_by_role("table", name="Environments")
    expect(table).to_contain_text("secret")
    assert "review/feat-x" not in table.inner_text()
    go(page, "#/environments?project=group/app")
    expect(table).to_contain_text("review/feat-x")
    row = page.get_by_role("row", name=re.compile(r"^production "))
    expect(row).to_contain_text("Progressing")
    row.get_by_role("link", name="production").click()

    badge = page.locator("#env-health")
    expect(badge).to_have_text("Progressing")
    expect(page.get_by_role("navigation", name="Resource tree")).to_contain_text("hello-7d9-def")
    want = sorted(n["id"] for n in hello_graph()["nodes"])
    page.wait_for_function(f"() => globalThis.kasdDashboard?.cy()?.nodes().length === {len(want)}")
    assert page.evaluate("globalThis.kasdDashboard.cy().nodes().map((n) => n.id()).sort()") == want
    assert page.evaluate("globalThis.kasdDashboard.cy().$id('apps/Deployment/prod/hello').data('status')") == "Progressing"
    assert page.evaluate("globalThis.kasdDashboard.cy().edges().length") == len(hello_graph()["edges"])
    page.evaluate("window.__samePage = true")
    keep(page, shots, "environment-graph.png")

    fake.call(fake.set_graph, 1, hello_graph("Healthy"))
    expect(badge).to_have_text("Healthy")
    page.wait_for_function("() => globalThis.kasdDashboard.cy().$id('apps/Deployment/prod/hello').data('status') === 'Healthy'")
    assert page.evaluate("window.__samePage") is True, "the page was reloaded"
    assert page.locator("#env-health").get_attribute("aria-live") == "polite"


def test_pod_logs_stream_and_delete(page: Any, fake: FakeKasd, shots: Path) -> None:
    from playwright.sync_api import expect

    page.locator('button.node[data-id="/Pod/prod/hello-7d9-abc"]').click()
    panel = page.get_by_role("complementary", name="Selected object")
    expect(panel.get_by_role("heading", name="Pod hello-7d9-abc")).to_be_visible()
    expect(panel.locator("pre.yaml")).to_contain_text("kind: Pod")
    expect(panel).to_contain_text("<b>Container image</b> already present")  # shown as text, not markup
    assert panel.locator("b").count() == 0

    panel.get_by_role("button", name="Follow logs").click()
    logs = panel.locator("#logs")
    expect(logs).to_contain_text("line 2: listening on :8080")
    fake.call(fake.log, "line 3: GET / 200")
    expect(logs).to_contain_text("line 3: GET / 200")
    keep(page, shots, "environment-logs.png")

    before = len(fake.seen)
    panel.get_by_role("button", name="Delete pod").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Delete pod prod/hello-7d9-abc?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    assert len(fake.seen) == before, "cancelling still sent the DELETE"

    panel.get_by_role("button", name="Delete pod").click()
    dialog.get_by_role("button", name="Delete pod").click()
    expect(panel).to_contain_text("Pod hello-7d9-abc is being deleted.")
    method, path, headers = fake.seen[-1]
    assert (method, path) == ("DELETE", "/api/kasd/v1/environments/1/pods/prod/hello-7d9-abc")
    assert headers["x-csrf-token"] == fake.csrf
    # kasd's watch sends the graph with the replacement; the graph and the panel follow
    page.wait_for_function("() => globalThis.kasdDashboard.cy().$id('/Pod/prod/hello-7d9-new').nonempty()")
    assert page.evaluate("globalThis.kasdDashboard.cy().$id('/Pod/prod/hello-7d9-abc').empty()")
    expect(panel.get_by_text("This object is no longer in the environment.")).to_be_visible()


def test_live_updates_come_back_after_the_stream_breaks(page: Any, fake: FakeKasd) -> None:
    from playwright.sync_api import expect

    banner = page.locator("#banner")
    expect(banner).to_be_hidden()
    # kasd drops a viewer that does not keep up, saying why (an "end" event); the page says so and comes back
    page.evaluate("""() => {
        window.__banners = [];
        const banner = document.querySelector("#banner");
        new MutationObserver(() => window.__banners.push(banner.hidden ? null : banner.textContent))
            .observe(banner, {attributes: true, childList: true, characterData: true, subtree: true});
    }""")
    fake.call(fake.end_watch, "ViewerTooSlow: the viewer fell 64 updates behind")
    page.wait_for_function("() => window.__banners.length > 0 && document.querySelector('#banner').hidden")
    assert ("Live updates stopped by kasd (ViewerTooSlow: the viewer fell 64 updates behind) — reconnecting…"
            in page.evaluate("window.__banners")), page.evaluate("window.__banners")

    fake.call(fake.break_watch, 503)
    expect(banner).to_contain_text("Live updates")
    expect(banner).to_have_attribute("role", "status")
    fake.call(fake.set_graph, 1, hello_graph("Degraded", ("hello-7d9-def", "hello-7d9-new")))
    fake.call(fake.mend_watch)
    expect(banner).to_be_hidden()
    expect(page.locator("#env-health")).to_have_text("Degraded")


def test_flux_reconcile_refusal_and_csrf(page: Any, fake: FakeKasd) -> None:
    from playwright.sync_api import expect

    page.locator('button.node[data-id="kustomize.toolkit.fluxcd.io/Kustomization/prod/hello"]').click()
    panel = page.get_by_role("complementary", name="Selected object")
    assert panel.get_by_role("button", name="Delete pod").count() == 0
    panel.get_by_role("button", name="Reconcile now").click()
    page.get_by_role("dialog").get_by_role("button", name="Reconcile").click()
    expect(panel).to_contain_text("Flux was asked to reconcile Kustomization hello.")
    method, path, headers = fake.seen[-1]
    assert (method, path) == ("POST", "/api/kasd/v1/environments/1/flux/Kustomization/prod/hello/reconcile")
    assert headers["x-csrf-token"] == fake.csrf

    # the same POST from the page without the CSRF header: refused (the cookie alone is not enough)
    status, body = page.evaluate("""async () => {
        const r = await fetch("/api/kasd/v1/environments/1/flux/Kustomization/prod/hello/reconcile", {method: "POST"});
        return [r.status, await r.json()];
    }""")
    assert status == 403
    assert "CSRF" in body["message"]

    go(page, "#/environments/2")
    expect(page.get_by_role("heading", name="Access refused")).to_be_visible()
    expect(page.get_by_role("alert")).to_have_text(REFUSAL)


def test_an_ended_session_goes_back_to_sign_in_and_returns(page: Any, fake: FakeKasd) -> None:
    from playwright.sync_api import expect

    fake.call(setattr, fake, "session", "a-new-one")  # kasd forgot the browser's session
    go(page, "#/environments?project=group/app")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("Your session has ended")
    page.get_by_label("Personal access token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("table", name="Environments")).to_contain_text("production")
    assert page.evaluate("location.hash") == "#/environments?project=group/app"
