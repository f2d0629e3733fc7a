"""What PostgresJournal costs: a durable op against a bare call, and a graph run with 20
durable ops against the same graph without the journal.

All sides run in this process, interleaved (the order rotates every round), on the SAME
DeterministicSaver (so the same pool of the same size), with two journal variants (a claim
before every new op, and claim-ahead, the default); the peer side runs the same graph
with ``graph.ainvoke`` / ``graph.invoke``, where ``durable()`` / ``durable_sync()`` simply
call the function. Ratios are ``journal time / bare time`` (lower is better; the target for
the graph runs is <= 1.15 with ops of 5 ms each). Round trips per op are counted by the
journal itself (one statement = one round trip).

    python benchmarks/bench_journal.py [--rounds 9] [--runs 4] [--dsn DSN]

The machine's load average is printed before and after: on a shared machine every round
trip also waits for its processes to be scheduled, so read the ratios with it.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]

from langgraph.graph import START, StateGraph  # noqa: E402
from typing_extensions import TypedDict  # noqa: E402

from langgraph_deterministic import DeterministicSaver, run_config  # noqa: E402
from langgraph_deterministic.runner import (  # noqa: E402
    DeterministicRunner,
    PostgresJournal,
    durable,
    durable_sync,
)

NODES, OPS_PER_NODE = 4, 5  # 20 durable ops per graph run


class S(TypedDict, total=False):
    r: Annotated[list[Any], operator.add]


def graph_builder(op_seconds: float, sync: bool) -> StateGraph[S]:
    g = StateGraph(S)
    prev = START
    for n in range(NODES):
        if sync:

            def node(state: S, n: int = n) -> S:
                out = [durable_sync(f"op{i}", _sleep, op_seconds, i) for i in range(OPS_PER_NODE)]
                return {"r": out}

        else:

            async def node(state: S, n: int = n) -> S:  # type: ignore[misc]
                out = [await durable(f"op{i}", _asleep, op_seconds, i) for i in range(OPS_PER_NODE)]
                return {"r": out}

        g.add_node(f"n{n}", node)
        g.add_edge(prev, f"n{n}")
        prev = f"n{n}"
    return g


def _sleep(seconds: float, i: int) -> int:
    if seconds:
        time.sleep(seconds)
    return i


async def _asleep(seconds: float, i: int) -> int:
    if seconds:
        await asyncio.sleep(seconds)
    return i


def ratio_line(name: str, ours: list[float], peer: list[float], per: int, note: str) -> str:
    ratios = [o / p for o, p in zip(ours, peer, strict=True)]
    o_ms, p_ms = statistics.median(ours) * 1e3, statistics.median(peer) * 1e3
    added_us = (o_ms - p_ms) * 1e3 / per
    return (
        f"{name:<42} journal {o_ms:8.2f} ms  bare {p_ms:8.2f} ms  ratio {statistics.median(ratios):.3f}x "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f})  +{added_us:7.0f} us/op  {note}"
    )


# The journal's variants, each run against the same bare graph: a claim before every new
# op (claim_ahead=0, the protocol before claim-ahead), and claim-ahead (the default).
VARIANTS = (("claim per op", 0.0), ("claim-ahead", 0.1))


def _order(rnd: int, sides: list[str]) -> list[str]:
    k = rnd % len(sides)
    return sides[k:] + sides[:k]


async def bench_async(dsn: str, rounds: int, runs: int) -> list[str]:
    lines = []
    async with DeterministicSaver(dsn) as saver:
        await saver.asetup()
        for label, op_s, sync_commit in (
            ("graph 20 ops x 5ms async", 0.005, True),
            ("  same, async commit", 0.005, False),
            ("op cost async (0 ms op)", 0.0, True),
            ("  same, async commit", 0.0, False),
        ):
            runners = {
                name: DeterministicRunner(
                    journal=PostgresJournal(
                        saver, synchronous_commit=sync_commit, claim_ahead=ahead
                    )
                )
                for name, ahead in VARIANTS
            }
            graph = graph_builder(op_s, sync=False).compile(checkpointer=saver)
            times: dict[str, list[float]] = {side: [] for side in ["peer", *runners]}
            trips = dict.fromkeys(runners, 0)
            ops = dict.fromkeys(runners, 0)
            for rnd in range(rounds + 1):  # round 0 warms up every side
                for side in _order(rnd, list(times)):
                    t0 = time.perf_counter()
                    for _ in range(runs):
                        cfg = run_config(f"b-{uuid.uuid4().hex}", "r1")
                        if side == "peer":
                            await graph.ainvoke({"r": []}, cfg)
                        else:
                            runner = runners[side]
                            await runner.ainvoke(graph, {"r": []}, cfg)
                            trips[side] += runner.last_stats.round_trips
                            ops[side] += len(runner.last_stats.executed)
                    if rnd:
                        times[side].append(time.perf_counter() - t0)
            for name in runners:
                lines.append(
                    ratio_line(
                        f"{label} [{name}]",
                        times[name],
                        times["peer"],
                        runs * NODES * OPS_PER_NODE,
                        f"{trips[name] / max(1, ops[name]):.2f} round trips/op",
                    )
                )
    return lines


def bench_sync(dsn: str, rounds: int, runs: int) -> list[str]:
    with DeterministicSaver(dsn) as saver:
        runners = {
            name: DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=ahead))
            for name, ahead in VARIANTS
        }
        graph = graph_builder(0.005, sync=True).compile(checkpointer=saver)
        times: dict[str, list[float]] = {side: [] for side in ["peer", *runners]}
        trips = dict.fromkeys(runners, 0)
        ops = dict.fromkeys(runners, 0)
        for rnd in range(rounds + 1):
            for side in _order(rnd, list(times)):
                t0 = time.perf_counter()
                for _ in range(runs):
                    cfg = run_config(f"b-{uuid.uuid4().hex}", "r1")
                    if side == "peer":
                        graph.invoke({"r": []}, cfg)
                    else:
                        runner = runners[side]
                        runner.invoke(graph, {"r": []}, cfg)
                        trips[side] += runner.last_stats.round_trips
                        ops[side] += len(runner.last_stats.executed)
                if rnd:
                    times[side].append(time.perf_counter() - t0)
        return [
            ratio_line(
                f"graph 20 ops x 5ms sync [{name}]",
                times[name],
                times["peer"],
                runs * NODES * OPS_PER_NODE,
                f"{trips[name] / max(1, ops[name]):.2f} round trips/op",
            )
            for name in runners
        ]


# pg_stat_wal is server-wide and backends report to it when they have been idle for
# 10 s: each side runs alone between two idle waits (so: one side per server at a time).
_STATS_IDLE_S = float(os.environ.get("LGD_BENCH_STATS_IDLE_S", "11"))  # tests: 0


def _wal_counters(dsn: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        # PostgreSQL 18 moved the WAL's fsync count from pg_stat_wal to pg_stat_io
        if conn.info.server_version >= 180000:
            row = conn.execute(
                "SELECT (SELECT wal_records FROM pg_stat_wal), (SELECT sum(fsyncs) FROM "
                "pg_stat_io WHERE object = 'wal')"
            ).fetchone()
        else:
            row = conn.execute("SELECT wal_records, wal_sync FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def bench_wal(dsn: str, runs: int) -> list[str]:
    """WAL flushes (fsyncs) and WAL records per graph run of 20 ops: exact counts, not
    timings, so they do not depend on the machine's load."""
    lines = []
    async with DeterministicSaver(dsn) as saver:
        graph = graph_builder(0.0, sync=False).compile(checkpointer=saver)
        sides: dict[str, DeterministicRunner | None] = {
            "bare": None,
            "claim-ahead": DeterministicRunner(journal=PostgresJournal(saver)),
            "claim-ahead, async commit": DeterministicRunner(
                journal=PostgresJournal(saver, synchronous_commit=False)
            ),
            "claim per op": DeterministicRunner(journal=PostgresJournal(saver, claim_ahead=0)),
        }
        counts: dict[str, tuple[float, float]] = {}
        for side, runner in sides.items():
            await asyncio.sleep(_STATS_IDLE_S)
            records0, syncs0 = _wal_counters(dsn)
            for _ in range(runs):
                cfg = run_config(f"w-{uuid.uuid4().hex}", "r1")
                if runner is None:
                    await graph.ainvoke({"r": []}, cfg)
                else:
                    await runner.ainvoke(graph, {"r": []}, cfg)
            await asyncio.sleep(_STATS_IDLE_S)
            records1, syncs1 = _wal_counters(dsn)
            # each _wal_counters call is one more (empty) transaction: not counted
            counts[side] = ((syncs1 - syncs0) / runs, (records1 - records0) / runs)
        bare_syncs, bare_records = counts["bare"]
        for side, (syncs, records) in counts.items():
            added = (
                ""
                if side == "bare"
                else (
                    f"  (+{(syncs - bare_syncs) / (NODES * OPS_PER_NODE):.2f} flushes, "
                    f"+{(records - bare_records) / (NODES * OPS_PER_NODE):.1f} records per op)"
                )
            )
            lines.append(
                f"WAL per graph run [{side}]{'':<{28 - len(side)}} {syncs:6.1f} flushes "
                f"{records:7.1f} records{added}"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=4, help="graph runs per side per round")
    ap.add_argument("--dsn", default=os.environ.get("DATABASE_URL"))
    ap.add_argument(
        "--wal",
        action="store_true",
        help="also count WAL flushes and records per run (pg_stat_wal; ~90 s of idle waits; "
        "needs the server to itself)",
    )
    args = ap.parse_args()
    server = None
    dsn = args.dsn
    if not dsn:
        from devtools.postgres import ensure_database_url

        dsn, server = ensure_database_url()
    from devtools.postgres import create_database, database_name, drop_database

    db = create_database(dsn, prefix="lgd_bench_journal")
    load_before = os.getloadavg()
    try:
        lines = asyncio.run(bench_async(db, args.rounds, args.runs))
        lines += bench_sync(db, args.rounds, args.runs)
        if args.wal:
            lines += asyncio.run(bench_wal(db, 10))
    finally:
        drop_database(dsn, database_name(db))
        if server is not None:
            server.stop()
    load_after = os.getloadavg()
    print(
        f"PostgresJournal vs bare calls, {args.rounds} rounds x {args.runs} runs, same saver/pool; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
