"""The real examples run here against real servers, as a user runs them (the how-to
pages' own blocks run in test_docs_pages.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.orchestrators.servers import RedisServer, TemporalDevServer

REPO = Path(__file__).resolve().parents[2]


def run_example(name: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / name)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "OK:" in done.stdout, done.stdout
    return done.stdout


def test_temporal_example(db: str, temporal_server: TemporalDevServer) -> None:
    out = run_example(
        "temporal_agent.py", {"DATABASE_URL": db, "TEMPORAL_ADDRESS": temporal_server.address}
    )
    assert "failed after one attempt: RunInputMismatchError" in out
    assert "failed after one attempt: BadRequestError" in out


def test_celery_example(db: str, redis_server: RedisServer) -> None:
    run_example("celery_agent.py", {"DATABASE_URL": db, "CELERY_BROKER_URL": redis_server.url})
