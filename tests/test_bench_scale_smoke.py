"""The scale builder makes a database both savers read alike, and bench_scale.py runs end
to end on a small one. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from benchmarks.scale_db import ScaleSpec, ThreadPlan, build, load_info
from langgraph.checkpoint.postgres import PostgresSaver

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def fresh(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_scale_smoke")
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def test_built_database_reads_the_same_through_both_savers(fresh: str) -> None:
    spec = ScaleSpec(checkpoints=3000, long_threads=((100, 1), (300, 1)), thread_steps=20)
    extra = ThreadPlan("planted", steps=7, run_prefix=None)
    seen = []
    info = build(
        fresh, spec, plans=[extra], after_thread=lambda lay, _: seen.append(lay), progress=str
    )
    assert info.counts["checkpoints"] >= 3000
    assert load_info(fresh, spec) is not None
    planted = next(lay for lay in seen if lay.plan.thread_id == "planted")
    assert len(planted.root_ids) == 7 and planted.run_ids == []
    with psycopg.connect(fresh, autocommit=True, prepare_threshold=0) as conn:
        ours = DeterministicSaver(conn, run_id_policy="off")
        ours.setup()
        peer = PostgresSaver(conn)  # type: ignore[arg-type]
        for thread, expected in ((info.long_threads[300][0], 10), ("planted", 7)):
            config = {"configurable": {"thread_id": thread}}
            a = list(ours.list(config, limit=10))  # type: ignore[arg-type]
            b = list(peer.list(config, limit=10))  # type: ignore[arg-type]
            assert [t.config for t in a] == [t.config for t in b]
            assert [t.checkpoint for t in a] == [t.checkpoint for t in b]
            assert [t.pending_writes for t in a] == [t.pending_writes for t in b]
            assert len(a) == expected
        run = info.run_ids(info.long_threads[100][0])[3]
        before = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE metadata ->> 'run_id' = %s", (run,)
        ).fetchone()
        assert before is not None and before[0] >= 5
        ours.delete_for_runs([run])
        after = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE metadata ->> 'run_id' = %s", (run,)
        ).fetchone()
        assert after == (0,)


def test_bench_scale_runs_end_to_end(pg_server_dsn: str) -> None:
    env = {**os.environ, "DATABASE_URL": pg_server_dsn}
    args = ["--checkpoints", "25000", "--rounds", "1", "--ops", "2"]
    try:
        proc = subprocess.run(
            [sys.executable, str(BENCHMARKS / "bench_scale.py"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        drop_database(pg_server_dsn, "lgd_scale_25000")
    assert "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout
    for name in ("list10_thread1000", "list10_thread5000", "list10_global_loop", "get_tuple"):
        assert name in out, out
    assert "delete_for_runs" in out and "JIT: no" in out, out
    assert "reads within 1.2x of the peer or faster" in out
