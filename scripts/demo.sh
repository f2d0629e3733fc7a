#!/usr/bin/env bash
# The main job: the demo, on an embedded Postgres unless DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh embedded
exec .venv/bin/python examples/demo.py "$@"
