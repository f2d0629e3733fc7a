"""Reads at scale: DeterministicSaver vs PostgresSaver on a database of >= 1M checkpoints.

    .venv/bin/python benchmarks/bench_scale.py                 # builds or reuses the DB
    DATABASE_URL=postgresql://... .venv/bin/python benchmarks/bench_scale.py
    .venv/bin/python benchmarks/bench_scale.py --checkpoints 2000000 --rounds 9

The database is built by ``scale_db.py`` in PostgresSaver's layout (its own setup() made
the schema) and kept for the next run: in ``$DATABASE_URL``'s server (database
``lgd_scale_<N>``), else in an embedded Postgres under ``.cache/bench-scale-pg``. Our
``setup()`` then adds our objects beside the peer's (its time is printed: on the first
run it builds the run-id index over every checkpoint, CONCURRENTLY).

Both savers get the SAME connection object (autocommit, prepare_threshold=0). Rounds are
interleaved, ours first in even rounds and the peer first in odd ones; the ratio is the
median over rounds of ours/peer throughput (>= 0.83x is "within 1.2x of the peer").
delete_for_runs is ours only (PostgresSaver does not implement it): its figures are
absolute, plus whether the plan compiled JIT or scanned a table whole.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from devtools.postgres import ensure_database_url  # noqa: E402
from harness import Timer, WorkloadResult, format_table, side_order  # noqa: E402
from langgraph_deterministic import DeterministicSaver  # noqa: E402
from langgraph_deterministic.checkpointer import _core, _reads  # noqa: E402
from scale_db import ScaleSpec, default_plans, ensure, ensure_database  # noqa: E402

READ_TARGET = 1 / 1.2


def explain(conn: psycopg.Connection[Any], operation: Any) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the statement our core generator yields first (the SQL we
    really run, with the batch's preceding statements), rolled back."""
    batch = next(operation)
    st = batch.statements[-1]
    plan: dict[str, Any] = {}
    with conn.transaction():
        for pre in batch.statements[:-1]:
            conn.execute(pre.sql, pre.params)
        found = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {st.sql}", st.params)
        row = found.fetchone()
        plan = row[0][0] if row else {}
        raise psycopg.Rollback()
    return plan


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", ()):
        out.extend(_nodes(child))
    return out


def plan_notes(plan: dict[str, Any]) -> str:
    nodes = _nodes(plan["Plan"])
    temp = sum(n.get("Temp Written Blocks", 0) for n in nodes[:1])
    seq = sorted({n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"})
    jit = "JIT" in plan
    return (
        f"{plan.get('Execution Time', 0):.1f} ms server, temp written {temp * 8} kB, "
        f"seq scans: {', '.join(seq) or 'none'}, JIT: {'yes' if jit else 'no'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=10, help="operations per round and side")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    data_dir = ROOT / ".cache" / "bench-scale-pg"
    admin, server = ensure_database_url(data_dir)
    try:
        return _run(admin, args)
    finally:
        if server is not None:
            server.stop()


def _run(admin: str, args: argparse.Namespace) -> int:
    spec = ScaleSpec(checkpoints=args.checkpoints)
    dsn = ensure_database(admin, f"lgd_scale_{args.checkpoints}")
    info = ensure(dsn, spec)
    print(f"database: {info.counts} (built in {info.build_seconds:.0f} s)")
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    ours = DeterministicSaver(conn)
    peer = PostgresSaver(conn)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    applied = ours.setup()
    print(
        f"our setup() on this database: {time.perf_counter() - t0:.2f} s, applied {applied or 'nothing (up to date)'}"
    )

    long1k = itertools.cycle(info.long_threads[1000])
    long5k = itertools.cycle(info.long_threads[5000])
    ordinary = [p.thread_id for p in default_plans(spec) if p.thread_id.startswith("thread-")]
    rng = random.Random()

    def cfg(thread: str, ns: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"thread_id": thread}
        if ns is not None:
            c["checkpoint_ns"] = ns
        return {"configurable": c}

    workloads: list[tuple[str, str, Callable[[Any], Callable[[], object]]]] = [
        ("list10_thread1000", "list(thread, limit=10), no checkpoint_ns, 1,000-checkpoint thread",
         lambda s: lambda: list(s.list(cfg(next(long1k)), limit=10))),
        ("list10_thread5000", "list(thread, limit=10), no checkpoint_ns, 5,000-checkpoint thread",
         lambda s: lambda: list(s.list(cfg(next(long5k)), limit=10))),
        ("list10_global_loop", 'list(None, filter={"source": "loop"}, limit=10)',
         lambda s: lambda: list(s.list(None, filter={"source": "loop"}, limit=10))),
        ("get_tuple", "get_tuple(latest) of a random 50-checkpoint thread",
         lambda s: lambda: s.get_tuple(cfg(rng.choice(ordinary), ""))),
        ("get_tuple_thread5000", "get_tuple(latest) of a 5,000-checkpoint thread",
         lambda s: lambda: s.get_tuple(cfg(next(long5k), ""))),
    ]  # fmt: skip
    results = []
    for name, description, make in workloads:
        result = WorkloadResult(name, description, READ_TARGET)
        fns = {"ours": make(ours), "peer": make(peer)}
        for side in ("ours", "peer"):  # warm-up
            fns[side]()
        for r in range(args.rounds):
            for side in side_order(r):
                timer = Timer()
                for _ in range(args.ops):
                    with timer.op():
                        fns[side]()
                result.samples[side].append(timer.sample(args.ops))
        results.append(result)
        print(f"  {name}: ours/peer {result.ratio:.2f}x", flush=True)
    print()
    print(format_table(results))

    # delete_for_runs: ours only. Each call deletes two runs (5 checkpoints each) of
    # random ordinary threads: a reused database loses a few hundred of its 200k runs.
    deletes = []
    for _ in range(args.rounds * args.ops):
        runs = [
            f"{rng.choice(ordinary)}:run-{rng.randrange(spec.thread_steps // spec.steps_per_run)}"
            for _ in range(2)
        ]
        t = time.perf_counter()
        ours.delete_for_runs(runs)
        deletes.append(time.perf_counter() - t)
    deletes.sort()
    print(
        f"\ndelete_for_runs (2 runs per call, {len(deletes)} calls, ours only; PostgresSaver "
        f"has none): p50 {deletes[len(deletes) // 2] * 1e3:.1f} ms, "
        f"max {deletes[-1] * 1e3:.1f} ms"
    )
    victim = [f"{rng.choice(ordinary)}:run-1", f"{next(long5k)}:run-7"]
    print("  plan:", plan_notes(explain(conn, _core.delete_for_runs(victim))))
    print("plans of our reads (EXPLAIN ANALYZE of the SQL the core yields):")
    codec = ours._codec
    for label, op in (
        ("list10_thread5000", _reads.list_checkpoints(codec, cfg(next(long5k)), None, None, 10)),
        ("list10_global_loop", _reads.list_checkpoints(codec, None, {"source": "loop"}, None, 10)),
    ):
        print(f"  {label}: {plan_notes(explain(conn, op))}")
    below = [r.name for r in results if r.status() != "ok"]
    print(f"\n{len(results) - len(below)}/{len(results)} reads within 1.2x of the peer or faster"
          + (f"; below: {', '.join(below)}" if below else ""))  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "counts": info.counts,
                    "ratios": {r.name: r.ratio for r in results},
                    "delete_for_runs_ms": [d * 1e3 for d in deletes],
                },
                indent=2,
            )
        )
    conn.close()
    return 0 if not below else 1


if __name__ == "__main__":
    sys.exit(main())
