// One environment: its health, the resource tree (the `owns` forest), the graph, a side panel for
// the selected object (YAML, events, live logs of a pod, the two actions), its deployments; kept
// live by the SSE path — the badge, tree and node colours change in place, without a reload.

import { ApiError, NetworkError, getJSON, getText, paths, request } from "./api.js";
import { append, badge, clear, h, projectOf, updateBadge, when } from "./dom.js";
import { drawGraph, updateGraph } from "./graph.js";

const MAX_LOG_CHARS = 200_000;  // the log pane keeps the newest text only (bounded memory)

const isFlux = (n) => /(^|\.)fluxcd\.io$/.test(n.group ?? "");
const isPod = (n) => n.group === "" && n.kind === "Pod";

export async function showEnvironment(envId, params, ui) {
  // One call: the answer carries the environment too, and each call lists the environment's objects
  // through its agent (the summary path would list them all again only for the roll-up).
  const resources = await getJSON(paths.resources(envId));
  const env = resources.environment ?? {};
  let graph = resources.graph;
  let selected = params.get("node");
  let cy = null;
  let logAbort = null;
  let source = null;
  let closed = false;

  const healthBadge = badge(graph.health);
  const healthText = h("p", { class: "health-message", id: "env-health-message" }, graph.health?.message ?? "");
  const problemsBox = h("div", { id: "problems" });
  const tree = h("nav", { class: "tree", "aria-label": "Resource tree" });
  const graphBox = h("div", { id: "graph", class: "graph", role: "img" });
  const panel = h("aside", { id: "panel", class: "panel", "aria-label": "Selected object" },
    h("p", { class: "help" }, "Select an object in the tree or the graph."));
  const deployments = h("section", { "aria-labelledby": "deployments-title" },
    h("h2", { id: "deployments-title" }, "Deployments"));

  ui.page(`Environment ${env.name ?? envId}`,
    h("p", { class: "env-meta" },
      projectOf(env),
      env.tier ? ` · tier ${env.tier}` : "", env.state ? ` · ${env.state}` : ""),
    h("p", {}, "Health: ", h("span", { id: "env-health", "aria-live": "polite", "aria-atomic": "true" }, healthBadge)),
    healthText,
    problemsBox,
    h("div", { class: "env-layout" },
      h("section", { class: "resources", "aria-labelledby": "resources-title" },
        h("h2", { id: "resources-title" }, "Resources"), tree,
        h("h2", { id: "graph-title" }, "Graph"), graphBox),
      panel),
    deployments);

  function showProblems(problems, hint) {
    clear(problemsBox);
    if (hint) append(problemsBox, h("p", { class: "notice" }, hint));
    if (problems?.length) {
      append(problemsBox, h("div", { class: "notice" },
        h("p", {}, "Some kinds could not be read:"),
        h("ul", {}, problems.map((p) =>
          h("li", {}, `${p.kind ?? "?"}${p.namespace ? ` in ${p.namespace}` : ""}: ${p.reason ?? ""} — ${p.message ?? ""}`)))));
    }
  }

  function nodeById(id) {
    return graph.nodes.find((n) => n.id === id);
  }

  function renderTree() {
    const children = new Map();
    for (const e of graph.edges ?? []) {
      if (e.relation !== "owns") continue;
      if (!children.has(e.source)) children.set(e.source, []);
      children.get(e.source).push(e.target);
    }
    const seen = new Set();
    const item = (id) => {
      const node = nodeById(id);
      if (!node || seen.has(id)) return null;
      seen.add(id);
      const kids = (children.get(id) ?? []).map(item).filter(Boolean);
      return h("li", {},
        h("button", {
          type: "button", class: "node", "data-id": id, "aria-current": id === selected ? "true" : false,
          onclick: () => select(id),
        }, h("span", { class: "kind" }, node.kind), " ", node.namespace ? `${node.namespace}/` : "", node.name, " ", badge(node.health)),
        kids.length ? h("ul", {}, kids) : null);
    };
    const roots = (graph.roots ?? []).map(item).filter(Boolean);
    clear(tree).append(roots.length ? h("ul", {}, roots) : h("p", {}, "Nothing is deployed."));
  }

  function applyGraph(fresh) {
    graph = fresh;
    updateBadge(healthBadge, graph.health);
    healthText.textContent = graph.health?.message ?? "";
    renderTree();
    if (cy) updateGraph(cy, graph);
    else if (graph.nodes.length) cy = drawGraph(graphBox, graph, select);
    graphBox.setAttribute("aria-label", `Graph of ${graph.nodes.length} objects; the resource tree lists the same objects`);
    if (selected) {
      const node = nodeById(selected);
      const panelBadge = panel.querySelector(".panel-health");
      if (node && panelBadge) updateBadge(panelBadge, node.health);
      const gone = panel.querySelector(".gone");
      if (gone) gone.hidden = Boolean(node);
    }
  }

  function stopLogs() {
    if (logAbort) logAbort.abort();
    logAbort = null;
  }

  async function select(id) {
    const node = nodeById(id);
    if (!node) return;
    stopLogs();
    selected = id;
    for (const b of tree.querySelectorAll("button.node")) {
      if (b.dataset.id === id) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current");
    }
    if (cy) {
      cy.$(":selected").unselect();
      cy.getElementById(id).select();
    }
    const panelBadge = badge(node.health);
    panelBadge.classList.add("panel-health");
    const result = h("div", { class: "action-result", role: "status", "aria-live": "polite" });
    const yaml = h("pre", { class: "yaml", tabindex: "0", "aria-label": "YAML" }, "Loading…");
    const events = h("div", { class: "events" }, "Loading…");
    const actions = h("div", { class: "actions" });
    if (isPod(node)) actions.append(h("button", { type: "button", class: "danger", id: "delete-pod", onclick: () => deletePod(node, result) }, "Delete pod"));
    if (isFlux(node)) actions.append(h("button", { type: "button", id: "reconcile", onclick: () => reconcile(node, result) }, "Reconcile now"));
    clear(panel).append(
      h("h2", { id: "panel-title" }, `${node.kind} ${node.name}`),
      h("p", {}, node.namespace ? `Namespace ${node.namespace} · ` : "", `${node.group ? `${node.group}/` : ""}${node.version}`, " · ", panelBadge),
      h("p", { class: "health-message" }, node.health?.message ?? ""),
      h("p", { class: "gone notice", hidden: true }, "This object is no longer in the environment."),
      actions, result);
    if (isPod(node)) panel.append(logSection(node));
    panel.append(h("h3", {}, "YAML"), yaml, h("h3", {}, "Events"), events);
    const params = new URLSearchParams(location.hash.split("?")[1] ?? "");
    params.set("node", id);
    history.replaceState(null, "", `#/environments/${encodeURIComponent(envId)}?${params}`);

    getText(paths.object(envId, node), "application/yaml").then(
      (text) => { if (selected === id) yaml.textContent = text; },
      (err) => { if (selected === id) { yaml.textContent = ""; ui.failed(err, yaml); } });
    getJSON(paths.events(envId, node)).then(
      (answer) => { if (selected === id) renderEvents(events, answer); },
      (err) => { if (selected === id) { clear(events); ui.failed(err, events); } });
  }

  function renderEvents(box, answer) {
    const items = Array.isArray(answer) ? answer : answer.items ?? answer.events ?? [];
    clear(box).append(items.length === 0 ? h("p", {}, "No events.") :
      h("table", { class: "data", "aria-label": "Events" },
        h("thead", {}, h("tr", {}, ["Type", "Reason", "Message", "Count", "Last seen"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, items.map((e) => h("tr", {},
          h("td", {}, e.type ?? ""), h("td", {}, e.reason ?? ""), h("td", {}, e.message ?? e.note ?? ""),
          h("td", {}, String(e.count ?? e.series?.count ?? "")),
          // kasd's shape (docs/openapi.json): last_timestamp; the others are Kubernetes' own field names
          h("td", {}, e.last_timestamp ?? e.lastTimestamp ?? e.eventTime ?? e.metadata?.creationTimestamp ?? ""))))));
  }

  function logSection(node) {
    const pre = h("pre", { class: "logs", id: "logs", tabindex: "0", "aria-label": "Pod logs" });
    const picker = h("select", { id: "log-container", "aria-label": "Container" });
    const button = h("button", { type: "button", id: "follow-logs" }, "Follow logs");
    const state = h("span", { class: "log-state", role: "status" });
    getJSON(paths.object(envId, node)).then((pod) => {
      for (const c of [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])]) {
        picker.append(h("option", { value: c.name }, c.name));
      }
    }, () => {});
    button.addEventListener("click", () => {
      if (logAbort) {
        stopLogs();
        return;
      }
      followLogs(node, picker.value, pre, button, state);
    });
    return h("section", { class: "log-section", "aria-labelledby": "logs-title" },
      h("h3", { id: "logs-title" }, "Logs"),
      h("div", { class: "inline" }, picker, button, state), pre);
  }

  async function followLogs(node, container, pre, button, state) {
    const abort = new AbortController();
    logAbort = abort;
    button.textContent = "Stop";
    state.textContent = "following";
    pre.textContent = "";
    let text = "";
    try {
      const response = await request("GET", paths.log(envId, node, container), { accept: "text/plain", signal: abort.signal });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += value;
        if (text.length > MAX_LOG_CHARS) text = text.slice(text.length - MAX_LOG_CHARS);
        pre.textContent = text;
        pre.scrollTop = pre.scrollHeight;
      }
      state.textContent = "ended";
    } catch (err) {
      if (err.name === "AbortError") {
        state.textContent = "stopped";
      } else {
        state.textContent = "";
        ui.failed(err, pre.parentElement);
      }
    } finally {
      if (logAbort === abort) logAbort = null;
      button.textContent = "Follow logs";
    }
  }

  async function act(result, title, text, ok, method, path, done) {
    if (!(await ui.confirm(title, text, ok))) return;
    clear(result);
    try {
      await request(method, path);
      result.append(h("p", { class: "ok" }, done));
    } catch (err) {
      ui.failed(err, result);
    }
  }

  function deletePod(node, result) {
    return act(result, "Delete pod?", `Delete pod ${node.namespace}/${node.name}? Its controller, if it has one, makes a new one.`,
      "Delete pod", "DELETE", paths.pod(envId, node), `Pod ${node.name} is being deleted.`);
  }

  function reconcile(node, result) {
    return act(result, "Reconcile now?", `Ask Flux to reconcile ${node.kind} ${node.namespace}/${node.name} now?`,
      "Reconcile", "POST", paths.reconcile(envId, node), `Flux was asked to reconcile ${node.kind} ${node.name}.`);
  }

  async function loadDeployments() {
    try {
      const answer = await getJSON(paths.deployments(envId));
      const list = Array.isArray(answer) ? answer : answer.deployments ?? [];
      append(deployments, list.length === 0 ? h("p", {}, "No deployments recorded.") :
        h("table", { class: "data" },
          h("thead", {}, h("tr", {}, ["When", "Ref", "User", "Pipeline", "Job", "Agent", "Namespaces"].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, list.map((d) => h("tr", {},
            h("td", {}, when(d.at ?? d.created_at)), h("td", {}, d.ref ?? ""), h("td", {}, typeof d.user === "object" && d.user !== null ? d.user.username ?? "" : d.user ?? ""),
            h("td", {}, String(d.pipeline_id ?? "")), h("td", {}, String(d.job_id ?? "")), h("td", {}, String(d.agent_id ?? "")),
            h("td", {}, (d.namespaces ?? []).join(", ")))))));
    } catch (err) {
      ui.failed(err, deployments);
    }
  }

  // Live updates. EventSource reconnects by itself after a network loss (the banner says so); when
  // it gives up (an HTTP error), one plain request finds out why: 401 → sign-in, 403 → the refusal.
  function watch() {
    if (closed) return;
    source = new EventSource(paths.watch(envId));
    let endedBecause = null;  // kasd's reason, when it ended the stream itself (an "end" event)
    source.addEventListener("open", () => {
      endedBecause = null;
      ui.banner(null);
    });
    source.addEventListener("end", (event) => {
      try {
        endedBecause = String(JSON.parse(event.data).message ?? "");
      } catch {
        endedBecause = "";
      }
    });
    source.addEventListener("graph", (event) => {
      try {
        applyGraph(JSON.parse(event.data));
      } catch (err) {
        console.error("bad graph event", err);
      }
    });
    source.addEventListener("problems", (event) => {
      try {
        const p = JSON.parse(event.data);
        showProblems(Array.isArray(p) ? p : p.problems ?? [], p.hint);
      } catch (err) {
        console.error("bad problems event", err);
      }
    });
    source.addEventListener("error", () => {
      if (closed) return;
      if (source.readyState === EventSource.CONNECTING) {
        ui.banner(endedBecause === null ? "Live updates interrupted — reconnecting…"
          : `Live updates stopped by kasd${endedBecause ? ` (${endedBecause})` : ""} — reconnecting…`);
        return;
      }
      source.close();
      ui.banner("Live updates stopped — checking…");
      getJSON(paths.environment(envId)).then(
        () => setTimeout(watch, 2000),
        (err) => {
          if (err instanceof NetworkError) setTimeout(watch, 3000);
          else if (err instanceof ApiError) { ui.banner(null); ui.failed(err, problemsBox); }
        });
    });
  }

  applyGraph(graph);
  showProblems(resources.problems, resources.hint);
  if (selected && nodeById(selected)) select(selected);
  watch();
  loadDeployments();

  globalThis.kasdDashboard = { cy: () => cy, graph: () => graph };
  return () => {
    closed = true;
    stopLogs();
    if (source) source.close();
    if (cy) cy.destroy();
    globalThis.kasdDashboard = undefined;
  };
}
