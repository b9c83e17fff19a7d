// The dashboard: a one-page app routed by the URL's fragment (#/agents, #/environments?project=…,
// #/environments/ID), so the server serves one HTML file and the fragment never reaches a log.

import { ApiError, NetworkError, forgetSession, getJSON, paths, signIn, signOut, signedIn } from "./api.js";
import { append, badge, clear, h, projectOf, when } from "./dom.js";
import { showEnvironment } from "./environment.js";

const main = document.getElementById("main");
const banner = document.getElementById("banner");
const signOutButton = document.getElementById("sign-out");

let leave = null;       // what the current page must stop (streams, EventSources) when we navigate
let afterSignIn = "#/agents";
let retryTimer = null;

// ---- shared by every page ----

export const ui = {
  // A failed call: 401 goes back to sign-in, 403 shows kasd's refusal, a network failure shows the
  // reconnecting banner and tries the page again.
  failed(err, where = main) {
    if (err instanceof ApiError && err.status === 401) {
      forgetSession();
      if (leave) {
        leave();
        leave = null;
      }
      afterSignIn = location.hash || "#/agents";
      showSignIn("Your session has ended or your token is no longer valid. Sign in again.");
      return;
    }
    if (err instanceof NetworkError) {
      ui.banner("Cannot reach kasd — reconnecting…");
      clearTimeout(retryTimer);
      retryTimer = setTimeout(route, 2000);
      return;
    }
    if (err?.name === "AbortError") return;
    const text = err instanceof ApiError ? err.message : `Something went wrong: ${err?.message ?? err}`;
    const alert = h("p", { class: "error", role: "alert" }, text);
    if (where === main) {
      // a whole page failed: say so in its place, not under what the last page showed
      ui.page(err instanceof ApiError && err.status === 403 ? "Access refused" : "Something went wrong", alert);
    } else {
      append(where, alert);
    }
  },
  banner(text) {
    if (text) {
      banner.textContent = text;
      banner.hidden = false;
    } else {
      banner.hidden = true;
      banner.textContent = "";
    }
  },
  confirm(title, text, okLabel) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-ok").textContent = okLabel;
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
      dialog.showModal();
      document.getElementById("confirm-cancel").focus();
    });
  },
  page(title, ...children) {
    document.title = `${title} · kasd`;
    clear(main);
    append(main, [h("h1", {}, title), ...children]);
    main.focus({ preventScroll: true });
  },
};

// ---- pages ----

function showSignIn(message) {
  signOutButton.hidden = true;
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "off", required: true,
    spellcheck: "false", "aria-describedby": "token-help",
  });
  const problems = h("div", { id: "sign-in-problems" });
  const form = h("form", { class: "sign-in", "aria-label": "Sign in" },
    h("label", { for: "token" }, "Personal access token"),
    input,
    h("p", { id: "token-help", class: "help" },
      "Make one with ", h("code", {}, "kasctl token personal"),
      ". It is sent once to sign in and never kept by the page."),
    h("button", { type: "submit" }, "Sign in"),
    problems);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear(problems);
    const token = input.value.trim();
    input.value = "";
    try {
      await signIn(token);
    } catch (err) {
      const text = err instanceof NetworkError ? "Cannot reach kasd. Try again." : err.message;
      append(problems, h("p", { class: "error", role: "alert" }, text));
      return;
    }
    const next = afterSignIn;
    afterSignIn = "#/agents";
    if (location.hash === next) route(); else location.hash = next;
  });
  ui.page("Sign in", message ? h("p", { class: "notice", role: "alert" }, message) : null, form);
  input.focus();
}

async function showAgents() {
  ui.page("Agents", h("p", { class: "loading" }, "Loading…"));
  const agents = await getJSON(paths.agents());
  const list = Array.isArray(agents) ? agents : agents.agents ?? [];
  const rows = list.map((a) => {
    const connections = a.connections ?? [];
    return h("tr", {},
      h("td", {}, String(a.id ?? "")),
      h("td", {}, h("a", { href: `#/agents/${encodeURIComponent(a.id)}`, title: "what its pods found in the cluster" },
        a.name ?? String(a.id))),
      h("td", {}, a.config_project ?? a.config_project_path ?? a.project ?? ""),
      h("td", {}, connections.length === 0 ? "not connected" : h("ul", { class: "plain" },
        connections.map((c) => h("li", {},
          // (among replicas, a tunnel another replica holds is known by that replica's name only)
          c.pod == null && c.replica ? `a tunnel on replica ${c.replica}` :
            `${c.pod ?? "?"} (${c.version ?? "unknown version"}) since ${when(c.since)}`,
          c.pod != null && c.replica ? ` on replica ${c.replica}` : "",
          c.pod != null && (c.pod_namespace || c.node) ?
            ` — pod in ${c.pod_namespace || "?"} on node ${c.node || "?"}, serving ${
              c.namespaces?.length ? c.namespaces.join(", ") : "the whole cluster"}` : "")))));
  });
  ui.page("Agents", list.length === 0 ?
    h("p", {}, "You see no agent: an agent is shown to the Developer role and up in its configuration project, " +
      "and to the people its user_access admits.") :
    h("table", { class: "data", "aria-label": "Connected agents" },
      h("thead", {}, h("tr", {}, ["ID", "Name", "Configuration project", "Connections"].map(
        (t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)));
}

// What each connected pod of one agent found in its cluster (GET /api/kasd/v1/agents/ID/cluster).
async function showAgentCluster(id) {
  ui.page(`Cluster of agent ${id}`, h("p", { class: "loading" }, "Loading…"));
  const answer = await getJSON(paths.agentCluster(id));
  const pods = answer.pods ?? [];
  const sections = pods.map((p) => {
    const r = p.report ?? {};
    const server = r.server ?? {};
    const components = r.components ?? [];
    return h("section", { "aria-label": `Cluster seen by ${p.pod}` },
      h("h3", {}, `Seen by pod ${p.pod} (reported ${when(p.received_at)} to replica ${p.replica})`),
      h("table", { class: "data" }, h("tbody", {},
        h("tr", {}, h("th", { scope: "row" }, "Kubernetes"),
          h("td", {}, `${server.gitVersion || "unknown"} (${server.platform || "unknown platform"})`)),
        h("tr", {}, h("th", { scope: "row" }, "Nodes"), h("td", {}, r.nodes == null ? "not known" : String(r.nodes))),
        h("tr", {}, h("th", { scope: "row" }, "Components"),
          h("td", {}, components.length === 0 ? "none recognised" : h("ul", { class: "plain" },
            components.map((c) => h("li", { title: (c.evidence ?? []).join(", ") }, c.name))))),
        h("tr", {}, h("th", { scope: "row" }, "API groups, CRDs"),
          h("td", {}, `${(r.api_groups ?? []).length} groups, ${(r.crds ?? []).length} CRDs`)),
        (r.errors ?? []).length === 0 ? null : h("tr", {}, h("th", { scope: "row" }, "Could not see"),
          h("td", {}, h("ul", { class: "plain" }, r.errors.map((e) => h("li", {}, e))))))));
  });
  ui.page(`Cluster of agent ${answer.name ?? id}`, h("p", {}, h("a", { href: "#/agents" }, "All agents")),
    sections.length === 0 ? h("p", {}, "No connected pod of this agent has reported its cluster.") : sections);
}

const TIERS = ["production", "staging", "testing", "development", "other"];

async function showEnvironments(params) {
  const project = params.get("project") ?? "";
  const group = params.get("group") ?? "";
  const tier = params.get("tier") ?? "";
  const form = h("form", { class: "inline", "aria-label": "Choose a project or group" },
    h("label", { for: "env-project" }, "Project"),
    h("input", { id: "env-project", name: "project", value: project, placeholder: "group/app" }),
    h("label", { for: "env-group" }, "or group"),
    h("input", { id: "env-group", name: "group", value: group, placeholder: "group" }),
    h("label", { for: "env-tier" }, "Tier"),
    h("select", { id: "env-tier", name: "tier" },
      h("option", { value: "" }, "any"),
      TIERS.map((t) => h("option", { value: t, selected: t === tier }, t))),
    h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const q = new URLSearchParams();
    for (const name of ["project", "group", "tier"]) {
      const v = form.elements[name].value.trim();
      if (v) q.set(name, v);
    }
    location.hash = `#/environments?${q}`;
  });
  if (!project && !group) {
    ui.page("Environments", form, h("p", {}, "Name a project (its full path or ID) or a group."));
    return;
  }
  const scope = project ? `project ${project}` : `group ${group}${tier ? `, tier ${tier}` : ""}`;
  ui.page(`Environments of ${scope}`, form, h("p", { class: "loading" }, "Loading…"));
  let url = project ? paths.projectEnvironments(project) : paths.groupEnvironments(group, tier);
  if (project && tier) url += `?tier=${encodeURIComponent(tier)}`;
  const envs = await getJSON(url);
  const cells = new Map();
  const rows = envs.map((e) => {
    const cell = h("td", { "aria-live": "polite" }, h("span", { class: "badge" }, "…"));
    cells.set(e.id, cell);
    return h("tr", {},
      h("td", {}, h("a", { href: `#/environments/${encodeURIComponent(e.id)}` }, e.name ?? String(e.id))),
      h("td", {}, projectOf(e) || project),
      h("td", {}, e.tier ?? ""),
      h("td", {}, e.state ?? ""),
      cell);
  });
  ui.page(`Environments of ${scope}`, form, envs.length === 0 ? h("p", {}, "No environments.") :
    h("table", { class: "data", "aria-label": "Environments" },
      h("thead", {}, h("tr", {}, ["Environment", "Project", "Tier", "State", "Health"].map(
        (t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)));
  // One health look-up per environment, four at a time.
  const queue = [...cells.entries()];
  const worker = async () => {
    for (let next = queue.shift(); next; next = queue.shift()) {
      const [id, cell] = next;
      try {
        const answer = await getJSON(paths.environment(id));
        clear(cell).append(badge(answer.health));
      } catch (err) {
        clear(cell).append(h("span", { class: "badge", title: err.message }, "unavailable"));
      }
    }
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
}

// ---- routing ----

async function route() {
  clearTimeout(retryTimer);
  if (leave) {
    leave();
    leave = null;
  }
  const hash = location.hash || "#/agents";
  if (!signedIn()) {
    if (hash !== "#/sign-in") afterSignIn = hash;
    showSignIn();
    return;
  }
  signOutButton.hidden = false;
  const [path, query = ""] = hash.slice(1).split("?");
  const params = new URLSearchParams(query);
  try {
    const envMatch = /^\/environments\/([^/]+)$/.exec(path);
    const agentMatch = /^\/agents\/([^/]+)$/.exec(path);
    if (agentMatch) {
      await showAgentCluster(decodeURIComponent(agentMatch[1]));
    } else if (envMatch) {
      leave = await showEnvironment(decodeURIComponent(envMatch[1]), params, ui);
    } else if (path === "/environments") {
      await showEnvironments(params);
    } else {
      await showAgents();
    }
    ui.banner(null);
  } catch (err) {
    ui.failed(err);
  }
}

signOutButton.addEventListener("click", async () => {
  try {
    await signOut();
  } catch {
    // the session is forgotten here either way
  }
  location.hash = "#/sign-in";
  route();
});

window.addEventListener("hashchange", route);
route();
