"""The README's main job runs end to end: real worker processes, a real SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def test_demo_retries_a_killed_worker_safely(pg_server_dsn: str) -> None:
    env = {**os.environ, "DATABASE_URL": pg_server_dsn}
    proc = subprocess.run(
        [sys.executable, str(DEMO)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # The peer's retry re-applies the input and the thread is stuck on a provider 400...
    assert "attempt 1: killed by signal 9" in out
    assert "400 Bad Request" in out
    # ...ours finishes with one user message and one refund.
    assert "one user message, one refund, thread finished" in out
