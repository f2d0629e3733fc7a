#!/usr/bin/env bash
# The test command: lint, type-check, then the whole suite against a real Postgres
# (embedded unless DATABASE_URL is set) and a real restate-server (fetched from npm).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k conformance`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh test
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
