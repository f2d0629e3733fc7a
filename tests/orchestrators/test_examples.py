"""The real examples run here against real servers, as a user runs them, and the docs'
code is the examples' code (every python block of the how-to pages appears verbatim in
the example the page is about)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
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


def test_celery_example(db: str, redis_server: RedisServer) -> None:
    run_example("celery_agent.py", {"DATABASE_URL": db, "CELERY_BROKER_URL": redis_server.url})


def _normalize(code: str) -> str:
    """One line per non-blank line, indentation dropped: a block quoted from inside a
    function still matches."""
    return "\n".join(line.strip() for line in code.splitlines() if line.strip()) + "\n"


@pytest.mark.parametrize(
    ("page", "example"),
    [("temporal.md", "temporal_agent.py"), ("celery.md", "celery_agent.py")],
)
def test_docs_code_is_the_examples_code(page: str, example: str) -> None:
    text = (REPO / "docs" / "how-to" / page).read_text("utf-8")
    source = _normalize((REPO / "examples" / example).read_text("utf-8"))
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, page
    for block in blocks:
        assert "\n" + _normalize(block) in "\n" + source, f"{page}: this block is not in {example}:\n{block}"
