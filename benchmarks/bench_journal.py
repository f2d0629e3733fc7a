"""What PostgresJournal costs: a durable op against a bare call, and a graph run with 20
durable ops against the same graph without the journal.

Both sides run in this process, interleaved (the order flips every round), on the SAME
DeterministicSaver (so the same pool of the same size); the peer side runs the same graph
with ``graph.ainvoke`` / ``graph.invoke``, where ``durable()`` / ``durable_sync()`` simply
call the function. Ratios are ``journal time / bare time`` (lower is better; the target for
the graph runs is <= 1.15 with ops of 5 ms each). Round trips per op are counted by the
journal itself (one statement = one round trip).

    python benchmarks/bench_journal.py [--rounds 7] [--dsn DSN]
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
        f"{name:<26} journal {o_ms:8.2f} ms  bare {p_ms:8.2f} ms  ratio {statistics.median(ratios):.3f}x "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f})  +{added_us:7.0f} us/op  {note}"
    )


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
            journal = PostgresJournal(saver, synchronous_commit=sync_commit)
            runner = DeterministicRunner(journal=journal)
            graph = graph_builder(op_s, sync=False).compile(checkpointer=saver)
            ours: list[float] = []
            peer: list[float] = []
            trips = ops = 0
            for rnd in range(rounds + 1):  # round 0 warms up both sides
                sides = ["ours", "peer"] if rnd % 2 else ["peer", "ours"]
                for side in sides:
                    t0 = time.perf_counter()
                    for _ in range(runs):
                        cfg = run_config(f"b-{uuid.uuid4().hex}", "r1")
                        if side == "ours":
                            await runner.ainvoke(graph, {"r": []}, cfg)
                            trips += runner.last_stats.round_trips
                            ops += len(runner.last_stats.executed)
                        else:
                            await graph.ainvoke({"r": []}, cfg)
                    if rnd:
                        (ours if side == "ours" else peer).append(time.perf_counter() - t0)
            lines.append(
                ratio_line(
                    label,
                    ours,
                    peer,
                    runs * NODES * OPS_PER_NODE,
                    f"{trips / max(1, ops):.2f} round trips/op",
                )
            )
    return lines


def bench_sync(dsn: str, rounds: int, runs: int) -> list[str]:
    with DeterministicSaver(dsn) as saver:
        runner = DeterministicRunner(journal=PostgresJournal(saver))
        graph = graph_builder(0.005, sync=True).compile(checkpointer=saver)
        ours: list[float] = []
        peer: list[float] = []
        trips = ops = 0
        for rnd in range(rounds + 1):
            for side in ["ours", "peer"] if rnd % 2 else ["peer", "ours"]:
                t0 = time.perf_counter()
                for _ in range(runs):
                    cfg = run_config(f"b-{uuid.uuid4().hex}", "r1")
                    if side == "ours":
                        runner.invoke(graph, {"r": []}, cfg)
                        trips += runner.last_stats.round_trips
                        ops += len(runner.last_stats.executed)
                    else:
                        graph.invoke({"r": []}, cfg)
                if rnd:
                    (ours if side == "ours" else peer).append(time.perf_counter() - t0)
        return [
            ratio_line(
                "graph 20 ops x 5ms sync",
                ours,
                peer,
                runs * NODES * OPS_PER_NODE,
                f"{trips / max(1, ops):.2f} round trips/op",
            )
        ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5, help="graph runs per side per round")
    ap.add_argument("--dsn", default=os.environ.get("DATABASE_URL"))
    args = ap.parse_args()
    server = None
    dsn = args.dsn
    if not dsn:
        from langgraph_deterministic.embedded import ensure_database_url

        dsn, server = ensure_database_url()
    from langgraph_deterministic.embedded import create_database, database_name, drop_database

    db = create_database(dsn, prefix="lgd_bench_journal")
    try:
        lines = asyncio.run(bench_async(db, args.rounds, args.runs))
        lines += bench_sync(db, args.rounds, args.runs)
    finally:
        drop_database(dsn, database_name(db))
        if server is not None:
            server.stop()
    print(
        f"PostgresJournal vs bare calls, {args.rounds} rounds x {args.runs} runs, same saver/pool"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
