"""Graph runs: DeterministicSaver vs langgraph's Postgres savers vs InMemorySaver, with
Postgres on loopback and 1 ms away, one run at a time and 8 / 32 at once.

Three sides run the same graph (bench_saver.py's: 10 sequential nodes, a 5-way ``Send``
fan-out and a join, ~10 KB of message state, ``durability="sync"``):

* ``ours``:   DeterministicSaver, ``run_id_policy="require"``, config from ``run_config()``
              (what the retry contract asks of users);
* ``peer``:   PostgresSaver (sync runs) / AsyncPostgresSaver (async runs);
* ``memory``: InMemorySaver, the limit (a fresh one per sample, so it does not grow).

Both Postgres savers use ONE database and the SAME pool object (psycopg_pool, 10
connections, opened full, LangGraph's documented settings ``autocommit=True,
prepare_threshold=0, row_factory=dict_row``): one sync pool for sync runs, one async pool
for async runs, per network. Networks: ``direct`` (the server's own address, a unix socket
for the embedded Postgres) and ``1ms`` (through delay_proxy.py, a TCP proxy in a child
process adding ``--rtt-ms`` (default 1) to every round trip, half each way; the round
trip it really adds is measured and printed). ``--ab`` adds a fourth side,
``ours_percall``: DeterministicSaver with ``buffer_writes=False`` (a commit per
``put_writes``), the measure of folding a superstep's writes into its checkpoint's
transaction.

Workloads, per network: ``graph_sync`` (invoke, one at a time), ``graph_async`` (ainvoke,
one at a time = concurrency 1), ``graph_async_c8`` / ``graph_async_c32`` (8 / 32 tasks
running graphs at once through the one shared saver; runs/s of the whole batch).

Rounds are interleaved: each round runs every (workload, network) cell on the three
sides back to back, the side order rotating every round. Ratios are the median over
rounds of that round's paired ratio (ours runs/s / other side's runs/s), with the spread.
CPU per run: client = this process's CPU (all threads; the proxy is another process),
server = CPU of the pool's Postgres backends over the sample (when the server is local).
Round trips: each side's graph on one traced connection (libpq trace, exact), per run and
per superstep; and "serial round trips per superstep" seen in the wall clock:
(median 1ms latency - median direct latency) / measured round-trip delay / supersteps.

Run: ``python benchmarks/bench_graph.py [--rounds 7] [--quick] [--json FILE]``
($DATABASE_URL, else an embedded Postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _src = Path(__file__).resolve().parents[1] / "src"
    if _src.is_dir():
        sys.path.insert(1, str(_src))
    import bench_saver as b
    import delay_proxy
    from harness import Sample, Timer, percentile, process_cpu_s, trace_counts
else:
    from . import bench_saver as b
    from . import delay_proxy
    from .harness import Sample, Timer, percentile, process_cpu_s, trace_counts

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from devtools.postgres import (
    create_database,
    database_name,
    drop_database,
    ensure_database_url,
    redact_dsn,
)
from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.pool import AsyncConnectionPool as AsyncNewestFirstPool
from langgraph_deterministic.pool import ConnectionPool as NewestFirstPool

SIDES: tuple[str, ...] = ("ours", "peer", "memory")
# --ab adds ours with per-call commits (buffer_writes=False): the gain of folding writes
AB_SIDE = b.GRAPH_SIDES[1]
NETS = ("direct", "1ms")
# LangGraph's documented connection settings; both savers share these pools.
POOL_KWARGS: dict[str, Any] = b.PEER_POOL_KWARGS


@dataclass(frozen=True)
class Workload:
    name: str
    sync: bool
    concurrency: int
    ops: int  # runs per sample (default mode)
    quick_ops: int
    # Targets (ours / other side), by (network, other side); absent = none.
    targets: dict[tuple[str, str], float]


WORKLOADS = [
    Workload("graph_sync", True, 1, 8, 1,
             {("direct", "peer"): 1.25, ("direct", "memory"): 0.5, ("1ms", "peer"): 2.0}),
    Workload("graph_async", False, 1, 8, 1,
             {("direct", "peer"): 1.25, ("direct", "memory"): 0.5, ("1ms", "peer"): 2.0}),
    Workload("graph_async_c8", False, 8, 16, 8, {}),
    Workload("graph_async_c32", False, 32, 64, 32, {("1ms", "peer"): 5.0}),
]  # fmt: skip
WORKLOAD_NAMES = [w.name for w in WORKLOADS]
CPU_TARGET = 0.8  # ours client+server CPU per run <= 0.8x the peer's (direct, one at a time)


# --- environment ------------------------------------------------------------------------


@dataclass
class Net:
    """One network path to the database: a sync and an async pool per saver (the SAME
    objects for both savers when ours accepts LangGraph's settings), and the graphs."""

    name: str
    dsn: str
    pools: list[Any]  # every distinct pool opened for this network
    pids: tuple[int, ...] = ()
    graphs: dict[tuple[str, bool], Any] = field(default_factory=dict)  # (side, sync) -> graph
    proxy: delay_proxy.Proxy | None = None  # the delay proxy this path goes through

    def server_cpu(self) -> float | None:
        cpu: float | None = process_cpu_s(self.pids)
        return cpu

    def timer(self, side: str) -> Timer:
        """A sample's timer: server CPU and the proxy's CPU on its path, for Postgres sides
        (InMemorySaver uses neither)."""
        return Timer(
            self.server_cpu if side != "memory" else None,
            self.proxy.cpu_s if self.proxy is not None and side != "memory" else None,
        )


def unix_socket(dsn: str) -> tuple[str | None, str | None, int]:
    """(unix socket path, or None and a TCP host, port) the DSN connects to."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/tmp")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}", None, port
    return None, host, port


def ours_takes_langgraph_settings(dsn: str, policy: str) -> str | None:
    """None if DeterministicSaver runs a graph on a connection with LangGraph's settings
    (dict_row), else the error it raised."""
    with psycopg.connect(dsn, **POOL_KWARGS) as conn:
        graph = b.compile_graph("ours", conn, policy=policy)
        try:
            graph.invoke(b.graph_input(), b.graph_config("ours"), durability="sync")
        except Exception as exc:  # any failure means: cannot share
            return f"{type(exc).__name__}: {exc}"
    return None


async def open_net(
    name: str,
    dsn: str,
    size: int,
    policy: str,
    shared: bool,
    proxy: delay_proxy.Proxy | None = None,
    pool_order: str = "oldest",
) -> Net:
    # "oldest": psycopg_pool's order (what a user's own pool does); "newest":
    # langgraph_deterministic.pool's (what DeterministicSaver(dsn) builds)
    sync_cls: Any = ConnectionPool if pool_order == "oldest" else NewestFirstPool
    async_cls: Any = AsyncConnectionPool if pool_order == "oldest" else AsyncNewestFirstPool

    async def pools(kwargs: dict[str, Any], tag: str) -> tuple[Any, Any]:
        pool: ConnectionPool[Any] = sync_cls(
            dsn, min_size=size, max_size=size, kwargs=kwargs, open=False, name=f"g-{tag}"
        )
        await asyncio.to_thread(pool.open, True, 30)
        apool: AsyncConnectionPool[Any] = async_cls(
            dsn, min_size=size, max_size=size, kwargs=kwargs, open=False, name=f"ga-{tag}"
        )
        await apool.open(wait=True, timeout=30)
        return pool, apool

    pool, apool = await pools(POOL_KWARGS, f"{name}-shared" if shared else f"{name}-peer")
    o_pool, o_apool = (pool, apool) if shared else await pools(b.OURS_POOL_KWARGS, f"{name}-ours")
    net = Net(name, dsn, [pool, apool] if shared else [pool, apool, o_pool, o_apool], proxy=proxy)
    net.pids = await b._backend_pids(pool, apool, size)
    if not shared:
        net.pids += await b._backend_pids(o_pool, o_apool, size)
    for side in ("ours", AB_SIDE, "peer"):
        for sync in (True, False):
            ours = side != "peer"
            conn = (o_pool if sync else o_apool) if ours else (pool if sync else apool)
            net.graphs[side, sync] = b.compile_graph(
                side, conn, asynchronous=not sync, policy=policy
            )
    return net


async def close_net(net: Net) -> None:
    for pool in net.pools:
        if isinstance(pool, AsyncConnectionPool):
            await pool.close()
        else:
            await asyncio.to_thread(pool.close)


def graph_for(net: Net, side: str, sync: bool) -> Any:
    if side == "memory":  # fresh per sample: InMemorySaver keeps every checkpoint
        return b.compile_graph("memory", asynchronous=not sync)
    return net.graphs[side, sync]


# --- one sample -----------------------------------------------------------------------


def run_sync(net: Net, side: str, ops: int) -> Sample:
    graph = graph_for(net, side, True)
    timer = net.timer(side)
    for _ in range(ops):
        with timer.op():
            out = graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")
        assert len(out["messages"]) == b.EXPECTED_MESSAGES, len(out["messages"])
    return timer.sample()


async def run_async(net: Net, side: str, ops: int, concurrency: int) -> Sample:
    graph = graph_for(net, side, False)
    per_task = max(1, ops // concurrency)
    timer = net.timer(side)

    async def task() -> None:
        for _ in range(per_task):
            t0 = time.perf_counter()
            out = await graph.ainvoke(b.graph_input(), b.graph_config(side), durability="sync")
            timer.add(time.perf_counter() - t0)
            assert len(out["messages"]) == b.EXPECTED_MESSAGES, len(out["messages"])

    await asyncio.gather(*(task() for _ in range(concurrency)))
    return timer.sample()


async def run_sample(w: Workload, net: Net, side: str, ops: int) -> Sample:
    if w.sync:
        return await asyncio.to_thread(run_sync, net, side, ops)
    return await run_async(net, side, ops, w.concurrency)


# --- round trips ------------------------------------------------------------------------


def supersteps_per_run() -> int:
    """Checkpoints one run writes (the input step -1, each superstep after it)."""
    graph = b.compile_graph("memory")
    saver = graph.checkpointer
    config = b.graph_config("memory")
    graph.invoke(b.graph_input(), config, durability="sync")
    return len(
        list(saver.list({"configurable": {"thread_id": config["configurable"]["thread_id"]}}))
    )


def traced_round_trips(
    dsn: str, policy: str, shared: bool, sides: Sequence[str] = ("ours", "peer")
) -> dict[str, dict[str, float]]:
    """Exact protocol counts of one sync graph run per Postgres side, each on one
    connection with the pool's settings (calls then share it one at a time, so every
    round trip is serial)."""
    out = {}
    for side in sides:
        kwargs = POOL_KWARGS if shared or side == "peer" else b.OURS_POOL_KWARGS
        with psycopg.connect(dsn, **kwargs) as conn:
            graph = b.compile_graph(side, conn, policy=policy)
            for _ in range(2):  # warm up: prepared statements, caches
                graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")
            config = b.graph_config(side)
            out[side] = trace_counts(
                conn, partial(graph.invoke, b.graph_input(), config, durability="sync")
            )
    return out


def measured_rtt_ms(dsn: str, n: int = 200) -> float:
    """Median wall time of ``SELECT 1`` on one connection, in ms."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


# --- results ----------------------------------------------------------------------------


@dataclass
class Cell:
    workload: Workload
    net: str
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {s: [] for s in SIDES})

    def ratios(self, other: str) -> list[float]:
        return [
            o.ops_per_s / p.ops_per_s
            for o, p in zip(self.samples["ours"], self.samples[other], strict=False)
        ]

    def ratio(self, other: str) -> float:
        return statistics.median(self.ratios(other))

    def rps(self, side: str) -> float:
        return float(statistics.median(s.ops_per_s for s in self.samples[side]))

    def p50_ms(self, side: str) -> float:
        return float(percentile([x for s in self.samples[side] for x in s.latencies], 50) * 1e3)

    def cpu_ms(self, side: str) -> tuple[float, float | None]:
        """(client, server) CPU ms per run: medians over rounds."""
        cli = statistics.median(s.client_cpu_s * 1e3 / s.ops for s in self.samples[side])
        srv = [
            s.server_cpu_s * 1e3 / s.ops for s in self.samples[side] if s.server_cpu_s is not None
        ]
        return cli, statistics.median(srv) if srv else None

    def proxy_ms(self, side: str) -> float | None:
        """The delay proxy's CPU ms per run (median over rounds), None when direct."""
        px = [s.proxy_cpu_s * 1e3 / s.ops for s in self.samples[side] if s.proxy_cpu_s is not None]
        return statistics.median(px) if px else None

    def status(self, other: str) -> str:
        target = self.workload.targets.get((self.net, other))
        if target is None:
            return ""
        return f">={target:.2f}x {'ok' if self.ratio(other) >= target else 'BELOW'}"


def format_cells(cells: Sequence[Cell]) -> str:
    head = (
        f"{'workload':<16} {'net':<6} {'ours r/s':>9} {'peer r/s':>9} {'mem r/s':>8} "
        f"{'vs peer':>7} {'min-max':>11} {'target':>12} {'vs mem':>7} {'min-max':>11} "
        f"{'target':>12} {'ours p50':>8} {'peer p50':>8}"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        rp, rm = c.ratios("peer"), c.ratios("memory")
        lines.append(
            f"{c.workload.name:<16} {c.net:<6} {c.rps('ours'):>9.1f} {c.rps('peer'):>9.1f} "
            f"{c.rps('memory'):>8.1f} {c.ratio('peer'):>6.2f}x "
            f"{f'{min(rp):.2f}-{max(rp):.2f}x':>11} {c.status('peer'):>12} "
            f"{c.ratio('memory'):>6.2f}x {f'{min(rm):.2f}-{max(rm):.2f}x':>11} "
            f"{c.status('memory'):>12} {c.p50_ms('ours'):>8.1f} {c.p50_ms('peer'):>8.1f}"
        )
    return "\n".join(lines)


def format_cpu(cells: Sequence[Cell]) -> str:
    head = (
        f"{'workload':<16} {'net':<6} {'ours cli+srv':>13} {'peer cli+srv':>13} {'mem cli':>8} "
        f"{'ours/peer':>9} {'target':>11} {'proxy o/p/m':>16}"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        (oc, os_), (pc, ps), (mc, _) = c.cpu_ms("ours"), c.cpu_ms("peer"), c.cpu_ms("memory")
        if os_ is None or ps is None:
            ratio, cells_txt = "n/a", (f"{oc:.1f}+n/a", f"{pc:.1f}+n/a")
            status = ""
        else:
            r = (oc + os_) / (pc + ps)
            ratio, cells_txt = f"{r:.2f}x", (f"{oc:.1f}+{os_:.1f}", f"{pc:.1f}+{ps:.1f}")
            one_at_a_time = c.net == "direct" and c.workload.concurrency == 1
            status = (
                f"<={CPU_TARGET}x {'ok' if r <= CPU_TARGET else 'ABOVE'}" if one_at_a_time else ""
            )
        px = [c.proxy_ms(s) for s in ("ours", "peer", "memory")]
        proxy = "/".join(f"{x:.1f}" for x in px if x is not None) if px[0] is not None else "-"
        lines.append(
            f"{c.workload.name:<16} {c.net:<6} {cells_txt[0]:>13} {cells_txt[1]:>13} "
            f"{mc:>8.1f} {ratio:>9} {status:>11} {proxy:>16}"
        )
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 7; 2 with --quick")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run per sample")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {WORKLOAD_NAMES}")
    parser.add_argument("--nets", default="direct,1ms", help="comma-separated subset of direct,1ms")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="proxy delay per round trip")
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument(
        "--pool-order", choices=("oldest", "newest"), default="oldest",
        help="which idle connection the pool hands out: psycopg_pool's (oldest, the "
             "default) or langgraph_deterministic.pool's (newest); both sides alike",
    )  # fmt: skip
    parser.add_argument("--proxy-engine", choices=delay_proxy.ENGINES, default="relay")
    parser.add_argument("--run-id-policy", default="require", choices=["require", "warn", "off"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply runs per sample")
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    parser.add_argument(
        "--ab", action="store_true", help=f"add side {AB_SIDE}: ours with buffer_writes=False"
    )
    args = parser.parse_args(argv)
    args.only = [n for n in args.only.split(",") if n]
    if unknown := sorted(set(args.only) - set(WORKLOAD_NAMES)):
        parser.error(f"unknown workload(s) {unknown}; choose from {WORKLOAD_NAMES}")
    args.nets = [n for n in args.nets.split(",") if n]
    if not args.nets or set(args.nets) - set(NETS):
        parser.error(f"--nets takes a subset of {list(NETS)}")
    if args.rounds is None:
        args.rounds = 2 if args.quick else 7
    return args


async def run_rounds(args: argparse.Namespace, nets: dict[str, Net]) -> list[Cell]:
    selected = [w for w in WORKLOADS if not args.only or w.name in args.only]
    cells = [Cell(w, n) for w in selected for n in args.nets]

    def n_ops(w: Workload) -> int:
        ops = max(w.concurrency, round((w.quick_ops if args.quick else w.ops) * args.scale))
        return int(ops - ops % w.concurrency)

    async def warm(c: Cell) -> None:
        for side in SIDES:
            await run_sample(c.workload, nets[c.net], side, c.workload.concurrency)

    if not args.quick:
        for c in cells:
            await warm(c)
    for r in range(args.rounds):
        started = time.perf_counter()
        order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
        for c in cells:
            for side in order:
                gc.collect()
                c.samples[side].append(
                    await run_sample(c.workload, nets[c.net], side, n_ops(c.workload))
                )
        print(f"  round {r + 1}/{args.rounds} done in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    global SIDES
    args = parse_args(argv)
    if args.ab:
        SIDES = (*SIDES, AB_SIDE)
    url, server = ensure_database_url()
    databases: list[str] = []
    proxy: delay_proxy.Proxy | None = None
    try:
        dsn = create_database(url, prefix="lgd_bench_graph")
        databases.append(dsn)
        # setup() on a plain autocommit connection: ours' setup() fails on a dict_row one
        # (KeyError in the advisory-lock poll, reported); the savers then run on dict_row.
        with psycopg.connect(dsn, autocommit=True) as conn:
            DeterministicSaver(conn).setup()
        with psycopg.connect(dsn, **POOL_KWARGS) as conn:
            PostgresSaver(conn).setup()  # type: ignore[arg-type]
        dsns = {"direct": dsn}
        if "1ms" in args.nets:
            unix, host, port = unix_socket(dsn)
            proxy = delay_proxy.start_proxy(
                unix=unix, host=host, port=port, rtt_ms=args.rtt_ms, engine=args.proxy_engine
            )
            dsns["1ms"] = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
        rtt = {n: measured_rtt_ms(dsns[n]) for n in args.nets}
        refused = ours_takes_langgraph_settings(dsn, args.run_id_policy)
        shared = refused is None
        pools_note = (
            f"both savers on the SAME pool per network (size {args.pool_size}, LangGraph's "
            f"settings, {args.pool_order} idle connection first)"
            if shared
            else f"NOT the same pool: DeterministicSaver failed on LangGraph's settings "
            f"(row_factory=dict_row: {(refused or '')[:80]}); each saver its own pool (size "
            f"{args.pool_size}), ours autocommit=True only"
        )
        added_rtt = rtt["1ms"] - rtt["direct"] if {"1ms", "direct"} <= set(args.nets) else None
        where = "embedded Postgres" if server is not None else redact_dsn(url)
        print(f"# bench_graph: DeterministicSaver (ours, policy {args.run_id_policy}, run_config) "
              f"vs PostgresSaver/AsyncPostgresSaver (peer) vs InMemorySaver (memory)\n"
              f"# server: {where}; one database; {pools_note}\n# rounds {args.rounds}{' (quick)' if args.quick else ''}; "
              f"python {platform.python_version()}, {os.cpu_count()} CPUs\n"
              f"# SELECT 1 round trip: "
              + ", ".join(f"{n} {rtt[n]:.3f} ms" for n in args.nets)
              + (f" (proxy adds {added_rtt:.3f} ms, {args.rtt_ms:g} ms asked)"
                 if added_rtt is not None else ""), flush=True)  # fmt: skip

        steps = supersteps_per_run()
        traced = traced_round_trips(
            dsn, args.run_id_policy, shared, [s for s in SIDES if s != "memory"]
        )

        async def go() -> list[Cell]:
            nets = {
                n: await open_net(
                    n, dsns[n], args.pool_size, args.run_id_policy, shared,
                    proxy if n == "1ms" else None, args.pool_order,
                )
                for n in args.nets
            }
            try:
                return await run_rounds(args, nets)
            finally:
                for net in nets.values():
                    await close_net(net)

        started = time.perf_counter()
        cells = asyncio.run(go())
        print(
            "\nruns/s: median over rounds; vs X = median over rounds of that round's paired "
            "(ours runs/s / X runs/s), spread min-max; p50 = latency of one run, ms"
        )
        print(format_cells(cells))
        print(
            "\nCPU ms per run (median over rounds): client = this process (all threads), "
            "srv = the pool's Postgres backends; proxy = the delay proxy's process (1ms only: "
            "it shares the cores, a real network would not cost this host that CPU)"
        )
        print(format_cpu(cells))
        if args.ab:
            print(f"\nA/B: ours (writes folded into the put) vs {AB_SIDE} (a commit per call)")
            for c in cells:
                ab = c.ratios(AB_SIDE)
                (oc, os_), (ac, as_) = c.cpu_ms("ours"), c.cpu_ms(AB_SIDE)
                cpu = (
                    f"cpu {oc:.1f}+{os_:.1f} vs {ac:.1f}+{as_:.1f} ms"
                    if os_ is not None and as_ is not None
                    else f"client cpu {oc:.1f} vs {ac:.1f} ms"
                )
                print(
                    f"  {c.workload.name:<16} {c.net:<6} {c.ratio(AB_SIDE):.2f}x "
                    f"({min(ab):.2f}-{max(ab):.2f}x)  p50 {c.p50_ms('ours'):.1f} vs "
                    f"{c.p50_ms(AB_SIDE):.1f} ms  {cpu}"
                )
        print(
            f"\nround trips (libpq trace of one sync run on one connection; {steps} "
            "checkpoints = supersteps per run incl. the input step):"
        )
        for side, t in traced.items():
            print(
                f"  {side:<12} {t['rt']:>4.0f} round trips/run = {t['rt'] / steps:.2f}/superstep; "
                f"{t['stmts']:.0f} statements, {t['parse']:.0f} parsed, {t['kb_out']:.1f} KB sent"
            )
        serial: dict[str, dict[str, float]] = {}
        if added_rtt is not None and added_rtt > 0:
            print(
                f"serial round trips per superstep seen in wall time, "
                f"(p50 1ms - p50 direct) / {added_rtt:.3f} ms / {steps}:"
            )
            for w in [
                w
                for w in WORKLOADS
                if w.concurrency == 1 and (not args.only or w.name in args.only)
            ]:
                by_net = {c.net: c for c in cells if c.workload is w}
                serial[w.name] = {
                    side: (by_net["1ms"].p50_ms(side) - by_net["direct"].p50_ms(side))
                    / added_rtt
                    / steps
                    for side in ("ours", "peer")
                }
                print(
                    f"  {w.name:<12} ours {serial[w.name]['ours']:.2f}  peer {serial[w.name]['peer']:.2f}"
                )
        print(f"\ntotal {time.perf_counter() - started:.0f} s")
        if args.json is not None:
            args.json.write_text(json.dumps({
                "meta": {"rounds": args.rounds, "quick": args.quick, "rtt_ms": rtt,
                         "supersteps": steps, "policy": args.run_id_policy,
                         "shared_pool": shared},
                "round_trips": traced,
                "serial_round_trips_per_superstep": serial,
                "cells": [{
                    "workload": c.workload.name, "net": c.net,
                    "runs_per_s": {s: c.rps(s) for s in SIDES},
                    "vs_peer": c.ratio("peer"), "vs_peer_rounds": c.ratios("peer"),
                    "vs_memory": c.ratio("memory"), "vs_memory_rounds": c.ratios("memory"),
                    "cpu_ms": {s: c.cpu_ms(s) for s in SIDES},
                    "proxy_cpu_ms": {s: c.proxy_ms(s) for s in SIDES},
                    "rounds": len(c.samples["ours"]),
                } for c in cells],
            }, indent=2))  # fmt: skip
        return 0
    finally:
        if proxy is not None:
            proxy.stop()
        for d in databases:
            drop_database(url, database_name(d))
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
