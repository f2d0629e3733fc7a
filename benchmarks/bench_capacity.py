"""What one Postgres carries: 1, 4, 8 and 16 worker processes running graphs at once
against one server, DeterministicSaver ("ours") and PostgresSaver ("the peer"); and the
bytes one 100-turn conversation leaves in the database.

Each worker is an OS process with one connection (LangGraph's documented settings
``autocommit=True, prepare_threshold=0, row_factory=dict_row``) running bench_saver.py's
graph (10 sequential nodes, a 5-way ``Send`` fan-out, a join, ~10 KB of messages,
``durability="sync"``: 14 supersteps per run) one run after another on fresh threads. All
workers start together; after ``--warmup`` seconds a window of ``--seconds`` is measured:

* supersteps/s (runs completed in the window x 14 / window), p50 / p99 latency per run;
* server CPU per superstep: the CPU of every process of the server (the postmaster's
  children, read from ``/proc``: the server must be local) over the window;
* WAL bytes and WAL fsyncs per superstep (``pg_current_wal_insert_lsn``, ``pg_stat_wal`` or,
  on PostgreSQL 18, ``pg_stat_io``): server-wide counts, so the server should be the
  benchmark's alone;
* client CPU per run (the workers' own), and what the server's backends were doing,
  sampled from ``pg_stat_activity`` every 50 ms: on CPU, waiting for a WAL flush (WALSync,
  WALWrite), on a lock (Lock, LWLock other than WAL), or idle waiting for the client.

Cells run ours and the peer alternately (which goes first alternates by round), each side in
its own database on the same server. Where a side saturates is where supersteps/s stop
growing with more workers; the wait sampling says on what. On a machine with few cores the
worker processes share them with the server, so the client's own CPU is part of what
saturates: the script prints the machine's core count beside the table.

Storage: one thread, 100 turns of a chat (a ~200-character question, a node answering
~400 characters), each turn a run; the bytes of every table (with its indexes and TOAST)
in the side's database, after minus before, and the rows left behind.

Run: ``python benchmarks/bench_capacity.py [--workers 1,4,8,16] [--seconds 10] [--rounds 1]``
($DATABASE_URL, else an embedded Postgres; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _src = Path(__file__).resolve().parents[1] / "src"
    if _src.is_dir():
        sys.path.insert(1, str(_src))
    _root = str(Path(__file__).resolve().parents[1])
    if _root not in sys.path:
        sys.path.insert(2, _root)
    import bench_saver as b
    from harness import percentile, process_cpu_s
else:
    from . import bench_saver as b
    from .harness import percentile, process_cpu_s

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from devtools.postgres import create_database, database_name, drop_database, ensure_database_url
from langgraph_deterministic import DeterministicSaver, run_config

SIDES = ("ours", "peer")
SUPERSTEPS = 14  # checkpoints per run of bench_saver's graph (the input step and 13 more)


# --- the workers ----------------------------------------------------------------------


def worker(side: str, dsn: str, barrier: Any, queue: Any, stop_at: Any) -> None:
    """Run graphs until the shared stop time; report each run's (start, end, cpu) times."""
    with psycopg.connect(dsn, **b.PEER_POOL_KWARGS) as conn:
        graph = b.compile_graph(side, conn)
        graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")  # warm
        barrier.wait()
        runs: list[tuple[float, float, float, float]] = []
        while True:
            t0, c0 = time.time(), time.process_time()
            if t0 >= stop_at.value:
                break
            out = graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")
            assert len(out["messages"]) == b.EXPECTED_MESSAGES
            runs.append((t0, time.time(), c0, time.process_time()))
    queue.put(runs)


# --- the server's counters ------------------------------------------------------------


def server_pids(conn: psycopg.Connection[Any]) -> list[int]:
    """The postmaster and its children (this server's processes), from /proc."""
    (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
    try:
        fields = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []  # not a local server
    postmaster = int(fields[1])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == postmaster:
                pids.append(int(entry.name))
    return pids


def server_cpu_s(pids: Sequence[int]) -> float | None:
    """CPU seconds of the server's processes that are still there (an autovacuum worker
    that ended in the window is missed: a small undercount)."""
    if not pids:
        return None
    return sum(process_cpu_s([pid]) or 0.0 for pid in pids)


def wal_reading(conn: psycopg.Connection[Any]) -> tuple[str, int, int]:
    """(WAL insert position, WAL fsyncs so far, full-page images so far)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    (lsn,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or ("0/0",)
    if conn.info.server_version >= 180000:  # PostgreSQL 18 counts them in pg_stat_io
        row = conn.execute("SELECT sum(fsyncs) FROM pg_stat_io WHERE object = 'wal'").fetchone()
    else:
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    (fpi,) = conn.execute("SELECT wal_fpi FROM pg_stat_wal").fetchone() or (0,)
    return str(lsn), int((row or (0,))[0] or 0), int(fpi)


def classify(state: str | None, kind: str | None, event: str | None) -> str:
    if state != "active" and state is not None:
        return "idle (client)"
    if kind is None:
        return "cpu"
    if event in ("WALSync", "WALWrite", "WALWriteLock", "WALInsert", "WALBufMapping"):
        return "wal flush"
    if kind in ("Lock", "LWLock"):
        return "lock"
    if kind in ("Client",):
        return "idle (client)"
    return f"{kind}:{event}"


def run_cell(
    admin: str, dsn: str, side: str, workers: int, warmup: float, seconds: float
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    queue = ctx.Queue()
    stop_at = ctx.Value("d", 1e18)
    procs = [
        ctx.Process(target=worker, args=(side, dsn, barrier, queue, stop_at))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait(timeout=180)
        pids = server_pids(conn)  # now with the workers' backends
        start = time.time()
        stop_at.value = start + warmup + seconds + 0.5
        time.sleep(warmup)
        w0, c0, lsn0, sync0, fpi0 = time.time(), server_cpu_s(pids), *wal_reading(conn)
        waits: Counter[str] = Counter()
        name = database_name(dsn)
        while time.time() < w0 + seconds:
            for row in conn.execute(
                "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()",
                (name,),
            ).fetchall():
                waits[classify(*row)] += 1
            time.sleep(0.05)
        w1, c1, lsn1, sync1, fpi1 = time.time(), server_cpu_s(pids), *wal_reading(conn)
        (wal,) = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (lsn1, lsn0)).fetchone() or (0,)
    runs = [r for _ in procs for r in queue.get(timeout=300)]
    for p in procs:
        p.join(timeout=60)
    done = [r for r in runs if w0 <= r[1] <= w1]
    n = len(done)
    steps = n * SUPERSTEPS
    total_waits = sum(waits.values()) or 1
    return {
        "side": side,
        "workers": workers,
        "runs": n,
        "supersteps_per_s": steps / (w1 - w0),
        "p50_ms": percentile([1000 * (e - s) for s, e, _, _ in done], 50) if done else None,
        "p99_ms": percentile([1000 * (e - s) for s, e, _, _ in done], 99) if done else None,
        "client_cpu_ms_per_run": statistics.mean(1000 * (c1_ - c0_) for _, _, c0_, c1_ in done)
        if done
        else None,
        "server_cpu_ms_per_step": 1000 * (c1 - c0) / steps
        if steps and c0 is not None and c1 is not None
        else None,
        "server_cpu_cores": (c1 - c0) / (w1 - w0) if c0 is not None and c1 is not None else None,
        "wal_bytes_per_step": float(wal) / steps if steps else None,
        "fsyncs_per_step": (sync1 - sync0) / steps if steps else None,
        "fpi_per_step": (fpi1 - fpi0) / steps if steps else None,
        "waits": {k: round(v / total_waits, 3) for k, v in waits.most_common()},
    }


# --- storage per conversation ---------------------------------------------------------


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def chat_graph() -> StateGraph[ChatState]:
    builder: StateGraph[ChatState] = StateGraph(ChatState)
    builder.add_node("answer", lambda s: {"messages": [AIMessage(b._text(400, "a"))]})
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder


def table_bytes(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(bytes of every table with its indexes and TOAST, rows) in this database."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute("SELECT relid::regclass::text FROM pg_stat_user_tables").fetchall()
    size = 0
    count = 0
    for (rel,) in rows:
        (s,) = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (rel,)).fetchone() or (
            0,
        )
        (c,) = conn.execute(f"SELECT count(*) FROM {rel}").fetchone() or (0,)
        size += int(s)
        count += int(c)
    return size, count


def storage(admin: str, side: str, turns: int) -> dict[str, Any]:
    dsn = create_database(admin, prefix=f"lgd_cap_store_{side}")
    try:
        with psycopg.connect(dsn, **b.PEER_POOL_KWARGS) as conn:
            saver: Any = DeterministicSaver(conn) if side == "ours" else PostgresSaver(conn)
            saver.setup()
            with psycopg.connect(dsn, autocommit=True) as reader:
                size0, rows0 = table_bytes(reader)
                graph = chat_graph().compile(checkpointer=saver)
                for turn in range(turns):
                    ask = {"messages": [HumanMessage(b._text(200, f"q{turn}"))]}
                    config: Any = (
                        run_config("chat", f"turn-{turn}")
                        if side == "ours"
                        else {"configurable": {"thread_id": "chat"}}
                    )
                    out = graph.invoke(ask, config, durability="sync")
                assert len(out["messages"]) == 2 * turns
                size1, rows1 = table_bytes(reader)
        return {"side": side, "turns": turns, "bytes": size1 - size0, "rows": rows1 - rows0}
    finally:
        drop_database(admin, database_name(dsn))


# --- main -----------------------------------------------------------------------------


def format_table(cells: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'side':5} {'procs':>5} {'steps/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'cli ms/run':>10} "
        f"{'srv ms/step':>11} {'srv cores':>9} {'WAL B/step':>10} {'FPI/step':>8} "
        f"{'fsync/step':>10}  waits"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        waits = ", ".join(f"{k} {v:.0%}" for k, v in c["waits"].items() if v >= 0.02)

        def f(v: Any, spec: str) -> str:
            return "-" if v is None else format(v, spec)

        lines.append(
            f"{c['side']:5} {c['workers']:>5} {f(c['supersteps_per_s'], '8.0f')} "
            f"{f(c['p50_ms'], '7.0f')} {f(c['p99_ms'], '7.0f')} {f(c['client_cpu_ms_per_run'], '10.1f')} "
            f"{f(c['server_cpu_ms_per_step'], '11.2f')} {f(c['server_cpu_cores'], '9.2f')} "
            f"{f(c['wal_bytes_per_step'], '10.0f')} {f(c['fpi_per_step'], '8.2f')} "
            f"{f(c['fsyncs_per_step'], '10.2f')}  {waits}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,4,8,16", help="comma-separated process counts")
    p.add_argument("--seconds", type=float, default=10.0, help="measured window per cell")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before the window")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--turns", type=int, default=100, help="turns of the stored conversation")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 worker, 1 s, 3 turns")
    p.add_argument("--json", type=Path, help="also write results as JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.workers, args.seconds, args.warmup, args.turns = "1", 1.0, 0.3, 3
    counts = [int(w) for w in args.workers.split(",")]
    admin, server = ensure_database_url()
    dbs: dict[str, str] = {}
    try:
        for side in SIDES:
            dbs[side] = create_database(admin, prefix=f"lgd_cap_{side}")
            with psycopg.connect(dbs[side], autocommit=True) as conn:
                (DeterministicSaver(conn) if side == "ours" else PostgresSaver(conn)).setup()
        with psycopg.connect(admin, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        print(
            f"# bench_capacity: {os.cpu_count()} CPUs (workers share them with the server), "
            f"Postgres {version[0] if version else '?'}, python {platform.python_version()}; "
            f"{args.seconds:g} s per cell after {args.warmup:g} s, {args.rounds} round(s)",
            flush=True,
        )
        cells: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for w in counts:
                order = SIDES if (r + counts.index(w)) % 2 == 0 else SIDES[::-1]
                for side in order:
                    cell = run_cell(admin, dbs[side], side, w, args.warmup, args.seconds)
                    cell["round"] = r
                    cells.append(cell)
                    print(
                        f"  round {r + 1} {side} x{w}: {cell['supersteps_per_s']:.0f} steps/s",
                        flush=True,
                    )
        cells.sort(key=lambda c: (c["workers"], c["side"], c["round"]))
        print()
        print(format_table(cells))
        stored = [storage(admin, side, args.turns) for side in SIDES]
        print()
        for s in stored:
            print(
                f"storage, {s['turns']}-turn conversation, {s['side']}: {s['bytes'] / 1024:.0f} KiB "
                f"in all tables ({s['rows']} rows)"
            )
        if args.json:
            args.json.write_text(json.dumps({"cells": cells, "storage": stored}, indent=1))
    finally:
        for name in dbs.values():
            drop_database(admin, database_name(name))
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
