# Sourced by scripts/*.sh: create or refresh .venv when pyproject.toml changed, then activate it.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -e "$stamp" ]; then
    echo "== installing dependencies into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi
. .venv/bin/activate
