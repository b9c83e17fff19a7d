// The resource graph: cytoscape.js with the layered (dagre) layout. Nodes are coloured by health and
// labelled with it too (colour is never the only signal); `owns` edges are solid, the other
// relations (selects, routes, scales, uses, binds) dashed and named.

import cytoscape from "../vendor/cytoscape.esm.min.js";
import dagre from "../vendor/cytoscape-dagre.esm.min.js";

cytoscape.use(dagre);

// Fill and text colour per health; the text colours keep a contrast of at least 4.5:1.
export const COLOURS = {
  Healthy: ["#2e7d32", "#ffffff"],
  Progressing: ["#1565c0", "#ffffff"],
  Degraded: ["#c62828", "#ffffff"],
  Suspended: ["#616161", "#ffffff"],
  Missing: ["#f9d71c", "#000000"],
  Unknown: ["#6a1b9a", "#ffffff"],
};

const STYLE = [
  {
    selector: "node",
    style: {
      shape: "round-rectangle",
      label: "data(label)",
      "text-wrap": "wrap",
      "text-valign": "center",
      "text-halign": "center",
      "font-size": 11,
      "font-family": "system-ui, sans-serif",
      width: "label",
      height: "label",
      padding: "8px",
      "border-width": 1,
      "border-color": "#1b1b1b",
    },
  },
  ...Object.entries(COLOURS).map(([status, [fill, text]]) => ({
    selector: `node[status = "${status}"]`,
    style: { "background-color": fill, color: text },
  })),
  { selector: "node:selected", style: { "border-width": 4, "border-color": "#000000" } },
  {
    selector: "edge",
    style: {
      width: 1.5,
      "curve-style": "bezier",
      "line-color": "#555555",
      "target-arrow-shape": "triangle",
      "target-arrow-color": "#555555",
      "font-size": 9,
    },
  },
  {
    selector: 'edge[relation != "owns"]',
    style: { "line-style": "dashed", label: "data(relation)", "text-rotation": "autorotate" },
  },
];

const LAYOUT = { name: "dagre", rankDir: "LR", nodeSep: 16, rankSep: 70, animate: false, fit: true, padding: 12 };

function statusOf(node) {
  const s = node.health?.status;
  return s in COLOURS ? s : "Unknown";
}

function nodeData(node) {
  const status = statusOf(node);
  return { id: node.id, label: `${node.kind}\n${node.name}\n${status}`, status, kind: node.kind };
}

function edgeElements(graph, ids) {
  return (graph.edges ?? [])
    .filter((e) => ids.has(e.source) && ids.has(e.target))
    .map((e) => ({
      group: "edges",
      data: { id: `${e.relation}:${e.source}->${e.target}`, source: e.source, target: e.target, relation: e.relation },
    }));
}

export function drawGraph(container, graph, onSelect) {
  const ids = new Set(graph.nodes.map((n) => n.id));
  const cy = cytoscape({
    container,
    elements: [
      ...graph.nodes.map((n) => ({ group: "nodes", data: nodeData(n) })),
      ...edgeElements(graph, ids),
    ],
    style: STYLE,
    layout: LAYOUT,
    wheelSensitivity: 0.3,
    selectionType: "single",
    boxSelectionEnabled: false,
    autoungrabify: true,
  });
  cy.on("tap", "node", (event) => onSelect(event.target.id()));
  return cy;
}

// Applies a new graph in place: changed nodes are restyled, new ones added, gone ones removed; the
// layout runs again only when the shape changed, so nothing jumps on a health change alone.
export function updateGraph(cy, graph) {
  const ids = new Set(graph.nodes.map((n) => n.id));
  let reshaped = false;
  cy.batch(() => {
    cy.nodes().forEach((n) => {
      if (!ids.has(n.id())) {
        n.remove();
        reshaped = true;
      }
    });
    for (const node of graph.nodes) {
      const existing = cy.getElementById(node.id);
      if (existing.nonempty()) {
        existing.data(nodeData(node));
      } else {
        cy.add({ group: "nodes", data: nodeData(node) });
        reshaped = true;
      }
    }
    const wanted = edgeElements(graph, ids);
    const edgeIds = new Set(wanted.map((e) => e.data.id));
    cy.edges().forEach((e) => {
      if (!edgeIds.has(e.id())) {
        e.remove();
        reshaped = true;
      }
    });
    for (const e of wanted) {
      if (cy.getElementById(e.data.id).empty()) {
        cy.add(e);
        reshaped = true;
      }
    }
  });
  if (reshaped) cy.layout(LAYOUT).run();
}
