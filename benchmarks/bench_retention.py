"""Retention sweeps at scale: ``saver.sweep`` beside live graph runs, and the naive cron.

    .venv/bin/python benchmarks/bench_retention.py --checkpoints 500000 --threads 2000

On the scale database of ``bench_scale.py`` (``scale_db.py``, PostgresSaver's layout;
built or reused, then our migrations applied), sweeps ``--threads`` expired threads with
``saver.sweep(strategy="delete")``, then as many others with what applications write by
hand (one transaction: ``DELETE ... WHERE thread_id IN (...)`` on the three tables).
Beside each, a worker process runs real graph turns (DeterministicSaver, one node) on
fresh threads; the same worker runs alone first for the baseline. Reports throughput
(threads/s, rows/s), the longest transaction (the longest any lock was held), WAL bytes,
the table sizes before, after and after a plain VACUUM, and the turns' p50/p99 latency.
Not part of the test suite: run by hand, figures in the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import psycopg
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


class S(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _reply(state: S) -> dict[str, Any]:
    return {"messages": [AIMessage(content="ok")]}


def worker(dsn: str, seconds: float) -> None:
    """Graph turns on fresh threads for ``seconds``: prints their latencies (ms)."""
    from langgraph.graph import START, StateGraph

    from langgraph_deterministic import DeterministicSaver, run_config

    g = StateGraph(S)
    g.add_node("reply", _reply)
    g.add_edge(START, "reply")
    out: list[float] = []
    with DeterministicSaver(dsn) as saver:
        graph = g.compile(checkpointer=saver)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            thread = f"zz-bench-{uuid.uuid4()}"
            for turn in range(2):
                t0 = time.perf_counter()
                graph.invoke({"messages": [("user", "hi")]}, run_config(thread, f"r{turn}"))
                out.append((time.perf_counter() - t0) * 1000)
    print(json.dumps(out))


def _start_worker(dsn: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", dsn, str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _latencies(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=600)
    ms = sorted(json.loads(out))
    return {
        "turns": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
    }


def _sizes(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {
        t: conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()[0]  # type: ignore[index]
        for t in TABLES
    }


def _lsn(conn: psycopg.Connection[Any]) -> Any:
    return conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]


def _wal_since(conn: psycopg.Connection[Any], lsn: Any) -> int:
    return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)).fetchone()[0])  # type: ignore[index]


def _copy(admin: str, template: str, name: str) -> str:
    from devtools.postgres import database_name

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {database_name(template)}")
    return psycopg.conninfo.make_conninfo(admin, dbname=name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=500_000)
    parser.add_argument("--threads", type=int, default=2000, help="threads per method")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], float(args.worker[1]))
        return 0

    from devtools.postgres import ensure_database_url
    from langgraph_deterministic import DeterministicSaver, RetentionPolicy
    from scale_db import ScaleSpec, ensure, ensure_database

    admin, server = ensure_database_url(ROOT / ".cache" / "bench-retention-pg")
    try:
        # built once and kept; each run sweeps a copy of it (CREATE DATABASE ... TEMPLATE)
        template = ensure_database(admin, f"lgd_scale_{args.checkpoints}")
        t0 = time.monotonic()
        info = ensure(template, ScaleSpec(checkpoints=args.checkpoints))
        with DeterministicSaver(template) as saver:
            saver.setup()
        print(f"scale database: {info.counts} ({time.monotonic() - t0:.0f} s)", flush=True)
        dsn = _copy(admin, template, "lgd_retention_run")
        result: dict[str, Any] = {"counts": info.counts}
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            result["sizes_before"] = _sizes(conn)
            baseline = _start_worker(dsn, 20)
            result["baseline"] = _latencies(baseline)
            print("baseline", result["baseline"], flush=True)

            # ours: saver.sweep, one transaction per thread; each batch timed (a write
            # batch is one thread's transaction: the longest any of its row locks was held)
            from langgraph_deterministic import retention

            txns: list[float] = []
            scans: list[float] = []

            def timed(op: Any) -> Any:
                try:
                    batch = next(op)
                    while True:
                        t0 = time.perf_counter()
                        results = yield batch
                        (txns if batch.atomic else scans).append(time.perf_counter() - t0)
                        batch = op.send(results)
                except StopIteration as stop:
                    return stop.value

            lsn = _lsn(conn)
            beside = _start_worker(dsn, 20)
            time.sleep(1)
            with DeterministicSaver(dsn, run_id_policy="off") as saver:
                t0 = time.perf_counter()
                steps = retention.plan(
                    RetentionPolicy(default_ttl=__import__("datetime").timedelta(days=1),
                                    limit=args.threads),
                    apply=True,
                )  # fmt: skip
                report = retention.drive(steps, lambda op: saver._run(timed(op)))
                took = time.perf_counter() - t0
            wal = _wal_since(conn, lsn)
            ours = {
                "threads": len(report.swept), "rows": report.rows_freed,
                "bytes": report.bytes_freed, "seconds": round(took, 2),
                "threads_per_s": round(len(report.swept) / took, 1),
                "rows_per_s": round(report.rows_freed / took),
                "longest_txn_ms": round(max(txns) * 1000, 1),
                "p50_txn_ms": round(statistics.median(txns) * 1000, 1),
                "p99_txn_ms": round(sorted(txns)[int(len(txns) * 0.99)] * 1000, 1),
                "scan_statements": len(scans), "longest_scan_ms": round(max(scans) * 1000, 1),
                "wal_bytes": wal, "skipped": {k: len(v) for k, v in report.skipped.items()},
            }  # fmt: skip
            ours["beside"] = _latencies(beside)
            result["sweep"] = ours
            print("sweep", ours, flush=True)

            # the naive cron: the next threads, one DELETE per table in one transaction
            last_swept = max(report.swept)
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id > %s "
                    "AND thread_id NOT LIKE 'zz-bench-%%' ORDER BY thread_id LIMIT %s",
                    (last_swept, args.threads),
                )
            ]
            rows_before = sum(
                conn.execute(f"SELECT count(*) FROM {t} WHERE thread_id = ANY(%s)", (ids,))
                .fetchone()[0]  # type: ignore[index]
                for t in TABLES
            )
            lsn = _lsn(conn)
            beside = _start_worker(dsn, 20)
            time.sleep(1)
            t0 = time.perf_counter()
            with conn.transaction():
                for t in TABLES:
                    conn.execute(f"DELETE FROM {t} WHERE thread_id IN (SELECT unnest(%s::text[]))",
                                 (ids,))  # fmt: skip
            took = time.perf_counter() - t0
            wal = _wal_since(conn, lsn)
            naive = {
                "threads": len(ids), "rows": rows_before, "seconds": round(took, 2),
                "threads_per_s": round(len(ids) / took, 1), "rows_per_s": round(rows_before / took),
                "longest_txn_ms": round(took * 1000, 1), "wal_bytes": wal,
            }  # fmt: skip
            naive["beside"] = _latencies(beside)
            result["naive"] = naive
            print("naive", naive, flush=True)

            result["sizes_after"] = _sizes(conn)
            conn.execute("VACUUM")
            result["sizes_after_vacuum"] = _sizes(conn)
            # what rewriting the tables returns to the disk (pg_repack's result, online;
            # VACUUM FULL takes an ACCESS EXCLUSIVE lock: on this copy only)
            conn.execute("VACUUM FULL checkpoints, checkpoint_blobs, checkpoint_writes")
            result["sizes_after_vacuum_full"] = _sizes(conn)
        print(json.dumps(result, indent=2))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
