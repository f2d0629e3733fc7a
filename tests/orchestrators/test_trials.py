"""A few of scripts/orchestrator_trials.py's trials, on the session's real servers: worker
processes SIGKILLed mid-turn, frozen past their timeouts and thawed, one message
delivered twice at once. The full runs (dozens of trials each) are the script's; their
figures are in docs/how-to/temporal.md and celery.md. (A pool process SIGKILLed after a
journaled refund is examples/celery_agent.py's first part, run by test_examples.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.orchestrators.servers import RedisServer, TemporalDevServer

from devtools.postgres import create_database

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "orchestrator_trials.py"


def trials(pg_server_dsn: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    dsn = create_database(pg_server_dsn, prefix="lgd_trials")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--dsn", dsn, "--seed", "7",
         "--logdir", str(tmp_path)],
        capture_output=True, text=True, timeout=400, env=os.environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    summary: dict[str, Any] = json.loads(done.stdout[done.stdout.index("\n{") :])
    return summary


def assert_clean(summary: dict[str, Any]) -> None:
    assert summary["ok"] == summary["trials"], summary
    for key in ("duplicated_inputs", "unanswered_tool_calls", "stuck_threads",
                "reexecuted_finished_effects", "psycopg_errors"):  # fmt: skip
        assert summary[key] == 0, (key, summary)


def test_temporal_worker_killed_and_frozen(
    pg_server_dsn: str, temporal_server: TemporalDevServer, tmp_path: Path
) -> None:
    """A worker SIGKILLed right after a journaled refund; another frozen past the heartbeat
    timeout and thawed after the retry started (a zombie)."""
    summary = trials(pg_server_dsn, tmp_path, "temporal", "--temporal", temporal_server.address,
                     "--journal", "--kills", "1", "--point", "tool:after", "--zombies", "1",
                     "--transient", "0")  # fmt: skip
    assert_clean(summary)
    assert summary["zombie_outcomes"], summary


def test_celery_twin_delivery(
    pg_server_dsn: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """One message published twice at once with one task id: exactly one delivery gets
    past the tool step, the run finishes, the thread takes its next turn."""
    summary = trials(pg_server_dsn, tmp_path, "celery", "--redis", redis_server.url,
                     "--journal", "--kills", "0", "--zombies", "0", "--duplicates", "1",
                     "--transient", "0")  # fmt: skip
    assert_clean(summary)
    assert summary["duplicate_winners"] == {"1": 1}, summary

