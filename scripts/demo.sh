#!/usr/bin/env bash
# The main job: the packaged demo (`langgraph-deterministic demo`), on an embedded
# Postgres unless --dsn or DATABASE_URL is given. The venv also gets the restate extra, so
# `.venv/bin/langgraph-deterministic demo --restate` runs from it; with --restate this
# script also fetches restate-server from npm into .cache/restate-server (where the tests
# and the demo look for it) when none is found.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh embedded,restate
for arg in "$@"; do
    if [ "$arg" = "--restate" ] && ! .venv/bin/python -c \
        'from langgraph_deterministic.demos._restate_local import locate_restate_server as f; f()' \
        2>/dev/null; then
        version="$(.venv/bin/python -c \
            'from langgraph_deterministic.demos._restate_local import RESTATE_VERSION as v; print(v)')"
        if ! command -v npm >/dev/null 2>&1; then
            echo "error: the Restate demo needs restate-server, fetched with npm, which is not" \
                "on PATH: install Node.js (it brings npm), or put a restate-server binary" \
                "(https://github.com/restatedev/restate/releases) on PATH or in" \
                "\$RESTATE_SERVER, then run this again." >&2
            exit 2
        fi
        echo "fetching restate-server $version from npm into .cache/restate-server" >&2
        npm install --prefix .cache/restate-server --no-audit --no-fund --silent \
            "@restatedev/restate-server@$version" >&2
    fi
done
exec .venv/bin/langgraph-deterministic demo "$@"
