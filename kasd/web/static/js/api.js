// The one place that talks to kasd: same-origin fetches with the session cookie, the CSRF token
// (held in memory only, never in storage or a URL) on every state-changing call, and errors turned
// into ApiError with the server's own message.

let csrfToken = null;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// A fetch that never reached kasd (network down, kasd restarting).
export class NetworkError extends Error {}

export function signedIn() {
  return csrfToken !== null;
}

export function forgetSession() {
  csrfToken = null;
}

const SAFE = new Set(["GET", "HEAD", "OPTIONS"]);

export async function request(method, path, { body, accept = "application/json", signal } = {}) {
  const headers = { Accept: accept };
  if (!SAFE.has(method) && csrfToken !== null) headers["X-CSRF-Token"] = csrfToken;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
      redirect: "error",
      signal,
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new NetworkError("cannot reach kasd");
  }
  if (!response.ok) throw new ApiError(response.status, await messageOf(response));
  return response;
}

export async function getJSON(path, options) {
  const response = await request("GET", path, options);
  return response.json();
}

export async function getText(path, accept) {
  const response = await request("GET", path, { accept });
  return response.text();
}

async function messageOf(response) {
  const text = await response.text().catch(() => "");
  try {
    const parsed = JSON.parse(text);
    const message = parsed.message ?? parsed.error ?? parsed.detail;
    if (message !== undefined) return typeof message === "string" ? message : JSON.stringify(message);
  } catch {
    // not JSON: the text itself, shortened
  }
  return text.trim().slice(0, 500) || `${response.status} ${response.statusText}`;
}

export async function signIn(token) {
  const response = await request("POST", "/-/sign_in", { body: { token } });
  const answer = await response.json();
  if (typeof answer.csrf_token !== "string" || answer.csrf_token === "") {
    throw new ApiError(500, "kasd did not send a CSRF token");
  }
  csrfToken = answer.csrf_token;
}

export async function signOut() {
  try {
    await request("POST", "/-/sign_out");
  } finally {
    csrfToken = null;
  }
}

// --- paths (the contract in one place) ---

const enc = encodeURIComponent;
// An empty path segment (the core API group, a cluster-scoped object's namespace) is sent as "_",
// which no API group or namespace name can be.
const seg = (s) => (s === "" || s === undefined || s === null ? "_" : enc(s));

export const paths = {
  agents: () => "/api/kasd/v1/agents",
  agentCluster: (id) => `/api/kasd/v1/agents/${enc(id)}/cluster`,
  projectEnvironments: (project) => `/api/v4/projects/${enc(project)}/environments`,
  groupEnvironments: (group, tier) =>
    `/api/v4/groups/${enc(group)}/environments${tier ? `?tier=${enc(tier)}` : ""}`,
  environment: (id) => `/api/kasd/v1/environments/${enc(id)}`,
  resources: (id) => `/api/kasd/v1/environments/${enc(id)}/resources`,
  watch: (id) => `/api/kasd/v1/environments/${enc(id)}/resources/watch`,
  deployments: (id) => `/api/kasd/v1/environments/${enc(id)}/deployments`,
  object: (id, n) =>
    `/api/kasd/v1/environments/${enc(id)}/objects/${seg(n.group)}/${seg(n.version)}/${seg(n.kind)}/${seg(n.namespace)}/${seg(n.name)}`,
  events: (id, n) => `${paths.object(id, n)}/events`,
  log: (id, n, container) => {
    const q = new URLSearchParams({ follow: "true", tailLines: "200" });
    if (container) q.set("container", container);
    return `/api/kasd/v1/environments/${enc(id)}/pods/${seg(n.namespace)}/${seg(n.name)}/log?${q}`;
  },
  pod: (id, n) => `/api/kasd/v1/environments/${enc(id)}/pods/${seg(n.namespace)}/${seg(n.name)}`,
  reconcile: (id, n) =>
    `/api/kasd/v1/environments/${enc(id)}/flux/${seg(n.kind)}/${seg(n.namespace)}/${seg(n.name)}/reconcile`,
};
