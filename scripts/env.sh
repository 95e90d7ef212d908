# Sourced by the other scripts: find Python 3.13 and make .venv with the project installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
runs_313() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' >/dev/null 2>&1; }
find_python() {
    # Try each candidate for real: pyenv's shim for python3.13 exists on PATH even when
    # 3.13 is not the selected version, and fails when called.
    for candidate in "${PYTHON:-}" python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13 \
                     /usr/local/bin/python3.13 /usr/bin/python3.13; do
        if [ -n "$candidate" ] && runs_313 "$candidate"; then echo "$candidate"; return; fi
    done
    echo "Python 3.13 not found: install it or set PYTHON=/path/to/python3.13" >&2
    exit 1
}
if [ ! -x .venv/bin/python ] || ! runs_313 .venv/bin/python; then
    rm -rf .venv
    "$(find_python)" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[dev]"
    rm -f .venv/.installed-* && touch "$stamp"
fi
# The compiled accelerators (setup.py), rebuilt in place when a source (a .pyx kernel, or a
# compiled _<name>_py.py and its _<name>_c.pxd, or a shared .pxd they cimport such as
# ingest/_capi.pxd) or setup.py changed, or a built module is missing or older than a
# source; INGEST_NO_EXTENSIONS=1 skips them (the daemon then runs the pure-Python path).
built=.venv/.built-$(find setup.py ingest -name setup.py -o -name "_*_c.pyx" -o -name "*.pxd" \
    -o -name "_*_py.py" | sort | xargs cat | sha1sum | cut -c1-12)
shared=$(find ingest -name '*.pxd' ! -name '_*_c.pxd')
for src in $(find ingest -name '_*_c.pyx' -o -name '_*_c.pxd'); do
    so=$(compgen -G "${src%.*}.*.so" | head -1 || true)
    py=${src%_c.pxd}_py.py
    if [ -z "$so" ] || [ "$src" -nt "$so" ] || { [ -f "$py" ] && [ "$py" -nt "$so" ]; }; then
        rm -f "$built"
    fi
    for pxd in $shared; do
        if [ -n "$so" ] && [ "$pxd" -nt "$so" ]; then rm -f "$built"; fi
    done
done
if [ ! -f "$built" ] && [ "${INGEST_NO_EXTENSIONS:-0}" = 0 ]; then
    out=$(.venv/bin/python setup.py --quiet build_ext --inplace 2>&1) || { echo "$out" >&2; exit 1; }
    if [[ "$out" == *"failed"* ]]; then  # the extensions are optional: setuptools only warns
        echo "$out" >&2
        echo "scripts/env.sh: the accelerators did not build (above): pure Python runs" >&2
    else
        rm -f .venv/.built-* && touch "$built"
    fi
fi
export PATH="$ROOT/.venv/bin:$PATH"
