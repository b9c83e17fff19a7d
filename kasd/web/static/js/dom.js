// Builds elements from text only: every string becomes a Text node or an attribute value, never
// markup (no innerHTML anywhere in the dashboard), so nothing the server sends can become HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export const HEALTH = ["Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"];

// A health badge: its colour comes from the class, and the word is always there too.
export function badge(health) {
  const status = HEALTH.includes(health?.status) ? health.status : "Unknown";
  return h("span", { class: `badge health-${status}`, title: health?.message || status }, status);
}

export function updateBadge(el, health) {
  const fresh = badge(health);
  el.className = fresh.className;
  el.title = fresh.title;
  el.textContent = fresh.textContent;
}

export function when(seconds) {
  if (seconds === undefined || seconds === null || seconds === "") return "";
  const d = typeof seconds === "number" ? new Date(seconds * 1000) : new Date(seconds);
  return Number.isNaN(d.getTime()) ? String(seconds) : d.toISOString().replace(".000Z", "Z");
}

// The project an environment belongs to, from GitLab's shape or kasd's.
export function projectOf(env) {
  const p = env.project;
  if (p && typeof p === "object") return p.path_with_namespace ?? p.full_path ?? String(p.id ?? "");
  return env.project_path ?? (typeof p === "string" ? p : "");
}
