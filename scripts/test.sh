#!/usr/bin/env bash
# The test command: lint, type-check, then the whole suite against a real Postgres
# (embedded unless DATABASE_URL is set) and a real restate-server (fetched from npm).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k conformance`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh test
# LangGraph's own server (tests/server) runs from a venv of its own: langgraph-cli[inmem]
# pins protobuf below what the test extra resolves (temporalio's). Made once, like .venv;
# LGD_SERVER_PYTHON names another. Without it the server tests skip with the reason.
if [ -z "${LGD_SERVER_PYTHON:-}" ]; then
    if LGD_VENV="$root/.venv-server" bash scripts/_venv.sh server; then
        export LGD_SERVER_PYTHON="$root/.venv-server/bin/python"
    else
        echo "warning: the server extra did not install into .venv-server; tests/server will skip" >&2
    fi
fi
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
