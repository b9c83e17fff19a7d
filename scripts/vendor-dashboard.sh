#!/usr/bin/env bash
# Re-fetches the dashboard's vendored JavaScript (kasd/web/static/vendor/) at the exact versions
# recorded in docs/dependencies.md, with npm, into a throw-away directory, and copies the built ES
# module files and each package's LICENSE. The files are copied byte for byte (only renamed .mjs → .js,
# so any static server sends them as JavaScript), so `git diff` after a run shows nothing unless a
# version changed. Not run by the tests; needs node/npm and the network.
set -euo pipefail
cd "$(dirname "$0")/.."

CYTOSCAPE=3.35.0
CYTOSCAPE_DAGRE=4.0.1   # bundles @dagrejs/dagre (MIT) inside its dist files
DAGRE=3.1.3             # only for dagre's LICENSE: the code is the copy inside cytoscape-dagre

out=kasd/web/static/vendor
work=$(mktemp -d /tmp/kasd-vendor.XXXXXX)
trap 'rm -rf "$work"' EXIT

(cd "$work" && npm init -y >/dev/null &&
    npm install --no-audit --no-fund --ignore-scripts --save-exact \
        "cytoscape@$CYTOSCAPE" "cytoscape-dagre@$CYTOSCAPE_DAGRE" "@dagrejs/dagre@$DAGRE" >/dev/null)

nm=$work/node_modules
mkdir -p "$out"
cp "$nm/cytoscape/dist/cytoscape.esm.min.mjs" "$out/cytoscape.esm.min.js"
cp "$nm/cytoscape/LICENSE" "$out/LICENSE.cytoscape"
cp "$nm/cytoscape-dagre/dist/cytoscape-dagre.min.mjs" "$out/cytoscape-dagre.esm.min.js"
cp "$nm/cytoscape-dagre/LICENSE" "$out/LICENSE.cytoscape-dagre"
cp "$nm/@dagrejs/dagre/LICENSE" "$out/LICENSE.dagre"
{
    echo "cytoscape $CYTOSCAPE"
    echo "cytoscape-dagre $CYTOSCAPE_DAGRE (with @dagrejs/dagre bundled)"
    echo "@dagrejs/dagre $DAGRE (LICENSE only)"
} >"$out/VERSIONS"
echo "vendored into $out:"
ls -l "$out"
