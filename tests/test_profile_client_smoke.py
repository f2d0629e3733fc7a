"""benchmarks/profile_client.py (issue 13's client-CPU profiling tool) runs end to end.

No timing is asserted: every side runs a graph run, sync and async, and reports its CPU
per run; a cProfile of the measured runs holds the saver's own calls.
"""

from __future__ import annotations

import json
import pstats
import subprocess
import sys
from pathlib import Path

from devtools.postgres import database_name, drop_database

TOOL = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_client.py"


def _tool(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_side_reports_cpu_per_run_and_a_profile(dsn: str, tmp_path: Path) -> None:
    db = _tool("prepare", "--url", dsn).strip().splitlines()[-1]
    try:
        for side in ("ours", "peer", "floor", "memory"):
            for mode in ("sync", "async"):
                out = _tool(
                    "run", "--dsn", db, "--side", side, "--mode", mode, "-c", "2",
                    "--runs", "2", "--warm", "0", "--pool-size", "2",
                )  # fmt: skip
                (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
                assert (row["side"], row["mode"], row["runs"]) == (side, mode, 2), row
                assert row["cpu_ms"] > 0 and row["timed_stores_per_run"] >= 0, row
        prof = tmp_path / "ours.prof"
        _tool("run", "--dsn", db, "--runs", "1", "--warm", "0", "--cprofile", str(prof))
        names = {fn for (_file, _line, fn) in pstats.Stats(str(prof)).stats}
        assert {"put", "put_writes", "get_tuple"} <= names, sorted(names)
    finally:
        drop_database(dsn, database_name(db))
