# Sourced by scripts/*.sh: create or refresh .venv when a pyproject.toml changed, then activate it.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml kubesim/pyproject.toml | sha1sum | cut -c1-12)
if [ ! -e "$stamp" ]; then
    echo "== installing dependencies into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev,demo]'
    # kubesim, the simulated cluster of the tests and the demo, is a distribution of its own.
    # Installed second: upgrading a .venv from before the split uninstalls the old kasd, whose
    # files list still names the `kubesim` script.
    .venv/bin/python -m pip install -q -e './kubesim[tls]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi
. .venv/bin/activate
