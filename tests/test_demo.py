"""The README's main job, `langgraph-deterministic demo`, run in-process through
``cli.main``: real worker processes, a real SIGKILL."""

from __future__ import annotations

import pytest

from langgraph_deterministic.cli import main


def test_demo_retries_a_killed_worker_safely(
    pg_server_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--dsn", pg_server_dsn]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Scenario: ")  # says what it shows before it runs
    # The peer's retry re-applies the input and the thread is stuck on a provider 400...
    assert "attempt 1: killed by signal 9" in out
    assert "400 Bad Request" in out
    # ...ours finishes with one user message and one refund, side by side:
    table = out[out.index("== what the thread looks like") :]
    assert "postgres-saver" in table and "deterministic" in table
    assert "user messages                            3                 1" in table
    assert "one user message, one refund, thread finished" in out
