# Sourced by the other scripts: make .venv (Python 3.11+) and install the project into it.
# Reinstalls only when pyproject.toml changed, so a second run starts at once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LGD_VENV:-$root/.venv}"
extras="${1:-test}"

pick_python() {
    for candidate in python3.12 python3.11 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "error: Python 3.11, 3.12 or 3.13 is required (python3.11, python3.12 or python3.13 on PATH)" >&2
    exit 1
}

if [ ! -x "$venv/bin/python" ]; then
    "$(pick_python)" -m venv "$venv"
fi
stamp="$venv/.lgd-installed-$extras"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e "$root[$extras]"
    echo "$want" > "$stamp"
fi
