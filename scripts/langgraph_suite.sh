#!/usr/bin/env bash
# LangGraph's own tests as an oracle: run the Postgres tests of the installed langgraph and
# langgraph-checkpoint-postgres (from their sdists) with their saver and with
# DeterministicSaver swapped in; print counts per mode and write a report of every test that
# passes on theirs and not on ours. Not part of scripts/test.sh: ~10 minutes per mode.
#   bash scripts/langgraph_suite.sh [--modes theirs,ours-off,ours-warn] [--suites ...] [-- -k EXPR]
# Uses $DATABASE_URL when set, else an embedded Postgres. Its files (a venv holding their test
# dependencies, so .venv stays as it is; their tests; the report) go to .langgraph-suite/.
set -euo pipefail
cd "$(dirname "$0")/.."
export LGD_SUITE_DIR="${LGD_SUITE_DIR:-$PWD/.langgraph-suite}"
export LGD_VENV="$LGD_SUITE_DIR/venv"
source scripts/_venv.sh test
deps=(pytest-mock syrupy langgraph-checkpoint-sqlite pycryptodome redis httpx anyio)
stamp="$LGD_VENV/.lgd-suite-deps"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${deps[*]}" ]; then
    "$LGD_VENV/bin/python" -m pip install --quiet "${deps[@]}"
    echo "${deps[*]}" > "$stamp"
fi
exec "$LGD_VENV/bin/python" benchmarks/langgraph_suite/run.py "$@"
