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
        for side in ("ours", "peer", "floor", "floor_fenced", "memory"):
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


def test_instructions_counts_a_side_under_callgrind(dsn: str) -> None:
    """``instructions`` builds callgrind's client-request library, runs a side under
    callgrind and prints its instructions per run (only the measured block's); unknown
    sides and a server count from too few runs are refused."""
    import re
    import shutil

    import pytest

    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        pytest.skip("valgrind or a C compiler is missing (apt-get install valgrind gcc)")
    db = _tool("prepare", "--url", dsn).strip().splitlines()[-1]
    try:
        out = _tool("instructions", "--dsn", db, "--sides", "floor_fenced", "--runs", "1",
                    "--warm", "1")  # fmt: skip
        (row,) = re.findall(r"^floor_fenced\s+([\d.]+)M\s+-\s+([\d.]+)M", out, re.MULTILINE)
        client, total = map(float, row)
        assert client == total and 10 < client < 1000, out  # millions per run
        for bad in (["--sides", "nobody"], ["--runs", "2", "--server-dumps", "/tmp"]):
            done = subprocess.run(
                [sys.executable, str(TOOL), "instructions", "--dsn", db, *bad],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 2 and done.stderr, (bad, done.stderr)
    finally:
        drop_database(dsn, database_name(db))
