"""The docs' runnable examples run here, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["temporal_style_retry.py", "celery_style_retry.py"])
def test_example_runs(db: str, name: str) -> None:
    env = {**os.environ, "DATABASE_URL": db}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK:" in done.stdout
