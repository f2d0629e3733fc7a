"""benchmarks/bench_restate_runner.py runs end to end on a real restate-server (no timing is
asserted): the timing table, and the stress table the Restate docs quote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.restate


RESTATE_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_restate_runner.py"


def test_restate_runner_benchmark_and_its_stress_table(restate_binary: Path) -> None:
    """bench_restate_runner.py on a real restate-server: the timing table, and --stress 1 on
    two shapes (the runner's fan-out, and the same graph without the runner) under forced
    replay: ok with the runner, no effect done twice (the stress table's columns). Every
    shape runs in both regimes in tests/runner/test_restate_e2e.py."""
    env = {**os.environ}  # (the fixture fetched the binary the benchmark finds)
    out = subprocess.run([sys.executable, str(RESTATE_BENCH), "--runs", "1", "--seq-ops", "2"],
                         capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "graph run inside the handler" in out.stdout and "overhead per op" in out.stdout
    out = subprocess.run([sys.executable, str(RESTATE_BENCH), "--stress", "1",
                          "--shapes", "fanout_ctx,naive", "--regimes", "forced"],
                         capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r.strip("|").split("|") for r in out.stdout.splitlines() if r.startswith("| ")]
    rows = [[c.strip() for c in r] for r in rows if r[0].strip() in ("forced replay", "no forced replay")]
    assert sorted(r[1] for r in rows) == ["fanout_ctx", "naive"], out.stdout
    for regime, graph, runs, ok, mismatch, hang, other, twice, retried in rows:
        if graph != "naive":
            assert (ok, mismatch, hang, other, twice) == (runs, "0", "0", "0", "0"), (regime, graph)
            assert retried == ("-" if regime == "forced replay" else "0"), (regime, graph)
