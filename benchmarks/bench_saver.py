"""DeterministicSaver vs langgraph's PostgresSaver / AsyncPostgresSaver, in one process.

Both savers run against the same Postgres server, each in its own fresh database set up
by its own ``setup()`` (so each pays for exactly the indexes it creates), each with its
own psycopg_pool pool of the same size (``--pool-size``, opened full before measuring),
configured the way each saver expects:

* ours:  ``kwargs={"autocommit": True}`` (tuple rows, psycopg's default prepare threshold,
  the same settings DeterministicSaver uses for the pools it creates from a DSN);
* peer:  ``kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}``
  (what ``PostgresSaver.from_conn_string`` uses).

Rounds are interleaved: in every round each workload runs on both sides back to back,
ours first in even rounds and the peer first in odd ones. One unrecorded warm-up round
comes first. The table shows median ops/s over rounds, p50/p95 latency over every
operation, and the ratio: the median over rounds of that round's ``ours ops/s / peer
ops/s`` (higher is better for us), with the spread of per-round ratios.

Workloads (the checkpoints are what LangGraph itself writes: format v4, a ``messages``
channel holding ~10 KB of LangChain messages stored as a blob):

* ``graph_async`` / ``graph_sync``: 10 sequential nodes, then a 5-way ``Send`` fan-out and
  a join; ~5 KB of input messages growing to ~10 KB; ``durability="sync"``; a fresh
  thread and a fresh ``run_id`` per run (ours: ``run_config(thread, run)``; the peer: the
  same ids as plain config); ``ainvoke`` / ``invoke``.
* ``put_async`` / ``put_sync``: put of a 10 KB checkpoint with a new channel version,
  each the child of the previous one.
* ``put_writes_async`` / ``put_writes_sync``: one task's writes (a ~500 B message and a
  ``branch:to:`` trigger) against one checkpoint, a new task id per call.
* ``get_tuple_async`` / ``get_tuple_sync``: latest checkpoint of a thread holding 10
  checkpoints, with 3 pending writes on the head.
* ``list100_async`` / ``list100_sync``: ``list(config, limit=100)`` on a thread of 110.
* ``concurrent_put8_async``: 8 tasks putting at once on ONE saver instance (their own
  threads), async.

Run: ``python benchmarks/bench_saver.py`` ($DATABASE_URL, else an embedded Postgres).
Flags: ``--rounds N``, ``--quick`` (smoke run), ``--only NAME`` (repeatable, or
comma-separated), ``--pool-size``, ``--json FILE``, ``--profile-dir DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

if __package__ in (None, ""):  # run as a script: make `harness` and the src/ layout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _src = Path(__file__).resolve().parents[1] / "src"
    if _src.is_dir():
        sys.path.insert(1, str(_src))
    from harness import (
        SIDES,
        Profiler,
        Sample,
        Timer,
        WorkloadResult,
        format_table,
        process_cpu_s,
        side_order,
        to_json,
    )
else:
    from .harness import (
        SIDES,
        Profiler,
        Sample,
        Timer,
        WorkloadResult,
        format_table,
        process_cpu_s,
        side_order,
        to_json,
    )

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from devtools.postgres import (
    create_database,
    database_name,
    drop_database,
    ensure_database_url,
    redact_dsn,
)
from langgraph_deterministic import DeterministicSaver, run_config

OURS_POOL_KWARGS: dict[str, Any] = {"autocommit": True}
PEER_POOL_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": 0,
    "row_factory": dict_row,
}

# --- payloads -------------------------------------------------------------------------


def _text(n: int, seed: str) -> str:
    """``n`` characters of varied text (not one repeated byte: keeps TOAST compression
    from making the payload unrealistically small)."""
    words = [f"{seed}{i:x}" for i in range(n // 4 + 1)]
    return " ".join(words)[:n]


def messages_10kb() -> list[AnyMessage]:
    """~10 KB of messages: a human turn and a few AI turns with ids, as a chat holds."""
    msgs: list[AnyMessage] = [HumanMessage(_text(4000, "q"), id=str(uuid.uuid4()))]
    msgs += [AIMessage(_text(1200, f"a{i}"), id=str(uuid.uuid4())) for i in range(5)]
    return msgs


def make_checkpoint(values: dict[str, Any], versions: dict[str, str]) -> Checkpoint:
    """A checkpoint shaped like the ones LangGraph 1.x writes (format v4)."""
    return {
        "v": 4,
        "id": str(uuid6(clock_seq=-1)),
        "ts": datetime.now(UTC).isoformat(),
        "channel_values": values,
        "channel_versions": versions,  # type: ignore[typeddict-item]
        "versions_seen": {"__input__": {}, "n1": {"messages": versions.get("messages", "")}},
        "updated_channels": list(versions),
    }


def thread_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


# --- the graph ------------------------------------------------------------------------


class GraphState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class WorkerInput(TypedDict):
    k: int


SEQUENTIAL_NODES = 10
FAN_OUT = 5
# input + one message per sequential node + one per worker + the join
EXPECTED_MESSAGES = 1 + SEQUENTIAL_NODES + FAN_OUT + 1


def _reply(tag: str) -> dict[str, list[AnyMessage]]:
    return {"messages": [AIMessage(_text(320, tag))]}


def build_graph(asynchronous: bool) -> StateGraph[GraphState]:
    builder: StateGraph[GraphState] = StateGraph(GraphState)

    def make_node(i: int) -> Callable[..., Any]:
        if asynchronous:

            async def anode(state: GraphState) -> dict[str, list[AnyMessage]]:
                return _reply(f"n{i}")

            return anode

        def node(state: GraphState) -> dict[str, list[AnyMessage]]:
            return _reply(f"n{i}")

        return node

    def fan_out(state: GraphState) -> list[Send]:
        return [Send("worker", {"k": k}) for k in range(FAN_OUT)]

    if asynchronous:

        async def worker(arg: WorkerInput) -> dict[str, list[AnyMessage]]:
            return _reply(f"w{arg['k']}")

        async def join(state: GraphState) -> dict[str, list[AnyMessage]]:
            return _reply("join")

    else:

        def worker(arg: WorkerInput) -> dict[str, list[AnyMessage]]:  # type: ignore[misc]
            return _reply(f"w{arg['k']}")

        def join(state: GraphState) -> dict[str, list[AnyMessage]]:  # type: ignore[misc]
            return _reply("join")

    previous = START
    for i in range(1, SEQUENTIAL_NODES + 1):
        builder.add_node(f"n{i}", make_node(i))
        builder.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    builder.add_node("worker", worker, input_schema=WorkerInput)  # type: ignore[arg-type]
    builder.add_node("join", join)
    builder.add_conditional_edges(previous, fan_out, ["worker"])
    builder.add_edge("worker", "join")
    builder.add_edge("join", END)
    return builder


def graph_input() -> dict[str, list[AnyMessage]]:
    return {"messages": [HumanMessage(_text(5000, "in"))]}


#: Sides of the graph benchmarks: ``ours_percall`` is ours with ``buffer_writes=0`` (a
#: commit per put_writes), for A/B runs of folding a superstep's writes into its put.
GRAPH_SIDES = ("ours", "ours_percall", "peer", "memory")


def graph_saver(side: str, conn: Any = None, *, policy: str = "require") -> Any:
    """The checkpointer of one side of the graph benchmarks over ``conn`` (a connection
    or a pool, sync or async: the peer's class follows it)."""
    if side == "memory":
        return InMemorySaver()  # callers make a fresh one per sample: it keeps everything
    if side == "peer":
        if isinstance(conn, AsyncConnectionPool | AsyncConnection):
            return AsyncPostgresSaver(conn)
        return PostgresSaver(conn)
    assert side in ("ours", "ours_percall"), side
    return DeterministicSaver(
        conn,
        run_id_policy=policy,  # type: ignore[arg-type]
        buffer_writes=0 if side == "ours_percall" else 0.05,
    )


def compile_graph(
    side: str, conn: Any = None, *, asynchronous: bool = False, policy: str = "require"
) -> Any:
    """The benchmark graph compiled with ``graph_saver(side, conn)``."""
    return build_graph(asynchronous).compile(checkpointer=graph_saver(side, conn, policy=policy))


def graph_config(side: str) -> RunnableConfig:
    """A fresh thread and run id per run. Ours gets its config from ``run_config()`` (what
    the retry contract asks of users: it adds an input-fingerprint callback); the peer gets
    the same thread/run ids as plain config, as its users would pass them."""
    thread_id, run_id = f"{side}-graph-{uuid.uuid4()}", str(uuid.uuid4())
    if side.startswith("ours"):
        return run_config(thread_id, run_id)
    return {
        "configurable": {"thread_id": thread_id, "run_id": run_id},
        "metadata": {"run_id": run_id},
    }


# --- the two sides --------------------------------------------------------------------


@dataclass
class Side:
    name: str
    sync_saver: BaseCheckpointSaver[Any]  # micro workloads (run_id_policy "off" for ours)
    async_saver: BaseCheckpointSaver[Any]
    sync_graph_saver: BaseCheckpointSaver[Any]  # graph runs (a run_id in every config)
    async_graph_saver: BaseCheckpointSaver[Any]
    sync_graph: Any = None
    async_graph: Any = None
    backend_pids: tuple[int, ...] = ()  # Postgres processes serving this side's pools

    def server_cpu(self) -> float | None:
        cpu: float | None = process_cpu_s(self.backend_pids)
        return cpu


@dataclass
class Env:
    sides: dict[str, Side]
    pools: list[Any]


async def open_sides(ours_dsn: str, peer_dsn: str, pool_size: int, policy: str) -> Env:
    def sync_pool(dsn: str, kwargs: dict[str, Any], name: str) -> ConnectionPool[Any]:
        pool: ConnectionPool[Any] = ConnectionPool(
            dsn, min_size=pool_size, max_size=pool_size, kwargs=kwargs, open=False, name=name
        )
        pool.open(wait=True, timeout=30)
        return pool

    async def async_pool(dsn: str, kwargs: dict[str, Any], name: str) -> AsyncConnectionPool[Any]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn, min_size=pool_size, max_size=pool_size, kwargs=kwargs, open=False, name=name
        )
        await pool.open(wait=True, timeout=30)
        return pool

    o_sync = await asyncio.to_thread(sync_pool, ours_dsn, OURS_POOL_KWARGS, "bench-ours")
    p_sync = await asyncio.to_thread(sync_pool, peer_dsn, PEER_POOL_KWARGS, "bench-peer")
    o_async = await async_pool(ours_dsn, OURS_POOL_KWARGS, "bench-ours-async")
    p_async = await async_pool(peer_dsn, PEER_POOL_KWARGS, "bench-peer-async")

    ours = Side(
        "ours",
        sync_saver=DeterministicSaver(o_sync, run_id_policy="off"),
        async_saver=DeterministicSaver(o_async, run_id_policy="off"),
        sync_graph_saver=DeterministicSaver(o_sync, run_id_policy=policy),  # type: ignore[arg-type]
        async_graph_saver=DeterministicSaver(o_async, run_id_policy=policy),  # type: ignore[arg-type]
    )
    peer_sync = PostgresSaver(p_sync)
    peer_async = AsyncPostgresSaver(p_async)
    peer = Side("peer", peer_sync, peer_async, peer_sync, peer_async)
    await asyncio.to_thread(ours.sync_saver.setup)  # type: ignore[attr-defined]
    await asyncio.to_thread(peer_sync.setup)
    for side in (ours, peer):
        side.sync_graph = build_graph(False).compile(checkpointer=side.sync_graph_saver)
        side.async_graph = build_graph(True).compile(checkpointer=side.async_graph_saver)
    ours.backend_pids = await _backend_pids(o_sync, o_async, pool_size)
    peer.backend_pids = await _backend_pids(p_sync, p_async, pool_size)
    return Env({"ours": ours, "peer": peer}, [o_sync, p_sync, o_async, p_async])


async def _backend_pids(
    sync_pool: ConnectionPool[Any], async_pool: AsyncConnectionPool[Any], size: int
) -> tuple[int, ...]:
    """The server processes behind every connection of both pools (min_size == max_size,
    so the set stays the same unless a connection breaks)."""

    def sync_pids() -> list[int]:
        conns = [sync_pool.getconn() for _ in range(size)]
        try:
            return [c.info.backend_pid for c in conns]
        finally:
            for c in conns:
                sync_pool.putconn(c)

    aconns = [await async_pool.getconn() for _ in range(size)]
    try:
        apids = [c.info.backend_pid for c in aconns]
    finally:
        for c in aconns:
            await async_pool.putconn(c)
    return tuple(await asyncio.to_thread(sync_pids)) + tuple(apids)


async def close_env(env: Env) -> None:
    for pool in env.pools:
        if isinstance(pool, AsyncConnectionPool):
            await pool.close()
        else:
            await asyncio.to_thread(pool.close)


# --- workloads ------------------------------------------------------------------------

SyncFn = Callable[[Side, int, str], Sample]
AsyncFn = Callable[[Side, int, str], Awaitable[Sample]]


@dataclass
class Workload:
    name: str
    description: str
    target: float
    ops: int  # per round and side, default mode
    quick_ops: int
    fn: SyncFn | AsyncFn  # (side, ops, round tag) -> Sample
    sync: bool = False

    async def run(self, side: Side, ops: int, tag: str, profiler: Profiler) -> Sample:
        """A sync workload runs in a worker thread so the event loop stays free; cProfile
        is per thread, so it is switched on in the thread that runs the batch (threads
        LangGraph starts itself, e.g. for the sync fan-out, are not followed)."""
        if self.sync:
            fn: SyncFn = self.fn
            return await asyncio.to_thread(
                profiler.wrap(self.name, side.name, lambda: fn(side, ops, tag))
            )
        afn: AsyncFn = self.fn
        with profiler.around(self.name, side.name):
            return await afn(side, ops, tag)


# graph runs


async def graph_async(side: Side, ops: int, tag: str) -> Sample:
    timer = Timer(side.server_cpu)
    for _ in range(ops):
        with timer.op():
            out = await side.async_graph.ainvoke(
                graph_input(), graph_config(side.name), durability="sync"
            )
        assert len(out["messages"]) == EXPECTED_MESSAGES, len(out["messages"])
    return timer.sample()


def graph_sync(side: Side, ops: int, tag: str) -> Sample:
    timer = Timer(side.server_cpu)
    for _ in range(ops):
        with timer.op():
            out = side.sync_graph.invoke(graph_input(), graph_config(side.name), durability="sync")
        assert len(out["messages"]) == EXPECTED_MESSAGES, len(out["messages"])
    return timer.sample()


# put


def _put_inputs(
    saver: BaseCheckpointSaver[Any], n: int
) -> list[tuple[Checkpoint, dict[str, Any], dict[str, Any]]]:
    """``n`` successive 10 KB checkpoints, each with a new version of ``messages``."""
    msgs = messages_10kb()
    out = []
    version = None
    for step in range(n):
        version = saver.get_next_version(version, None)
        versions = {"messages": version, "__start__": "00000000000000000000000000000001.0"}
        ckpt = make_checkpoint({"messages": msgs}, versions)
        out.append((ckpt, {"source": "loop", "step": step, "parents": {}}, {"messages": version}))
    return out


async def put_async(side: Side, ops: int, tag: str) -> Sample:
    saver = side.async_saver
    inputs = _put_inputs(saver, ops)
    config = thread_config(f"{side.name}-put-{tag}")
    timer = Timer(side.server_cpu)
    for ckpt, meta, versions in inputs:
        with timer.op():
            config = await saver.aput(config, ckpt, meta, versions)  # type: ignore[arg-type]
    return timer.sample()


def put_sync(side: Side, ops: int, tag: str) -> Sample:
    saver = side.sync_saver
    inputs = _put_inputs(saver, ops)
    config = thread_config(f"{side.name}-put-{tag}")
    timer = Timer(side.server_cpu)
    for ckpt, meta, versions in inputs:
        with timer.op():
            config = saver.put(config, ckpt, meta, versions)  # type: ignore[arg-type]
    return timer.sample()


# put_writes


def _writes() -> list[tuple[str, Any]]:
    return [("messages", [AIMessage(_text(500, "pw"))]), ("branch:to:n2", None)]


async def put_writes_async(side: Side, ops: int, tag: str) -> Sample:
    saver = side.async_saver
    ((ckpt, meta, versions),) = _put_inputs(saver, 1)
    config = await saver.aput(thread_config(f"{side.name}-pw-{tag}"), ckpt, meta, versions)  # type: ignore[arg-type]
    writes = _writes()
    timer = Timer(side.server_cpu)
    for i in range(ops):
        with timer.op():
            await saver.aput_writes(config, writes, f"task-{i}", "~__pregel_pull, n2")
    return timer.sample()


def put_writes_sync(side: Side, ops: int, tag: str) -> Sample:
    saver = side.sync_saver
    ((ckpt, meta, versions),) = _put_inputs(saver, 1)
    config = saver.put(thread_config(f"{side.name}-pw-{tag}"), ckpt, meta, versions)  # type: ignore[arg-type]
    writes = _writes()
    timer = Timer(side.server_cpu)
    for i in range(ops):
        with timer.op():
            saver.put_writes(config, writes, f"task-{i}", "~__pregel_pull, n2")
    return timer.sample()


# reads: the threads are written once per side (by the sync saver) and read every round


READ_THREAD_CHECKPOINTS = 10
LIST_THREAD_CHECKPOINTS = 110
LIST_LIMIT = 100


def fill_thread(saver: BaseCheckpointSaver[Any], thread_id: str, n: int) -> None:
    config = thread_config(thread_id)
    for ckpt, meta, versions in _put_inputs(saver, n):
        config = saver.put(config, ckpt, meta, versions)  # type: ignore[arg-type]
    for t in range(3):
        saver.put_writes(config, _writes()[:1], f"pending-{t}", "~__pregel_pull, n2")


async def get_tuple_async(side: Side, ops: int, tag: str) -> Sample:
    saver, config = side.async_saver, thread_config(f"{side.name}-read")
    timer = Timer(side.server_cpu)
    for _ in range(ops):
        with timer.op():
            found = await saver.aget_tuple(config)
        assert found is not None and len(found.pending_writes or ()) == 3
    return timer.sample()


def get_tuple_sync(side: Side, ops: int, tag: str) -> Sample:
    saver, config = side.sync_saver, thread_config(f"{side.name}-read")
    timer = Timer(side.server_cpu)
    for _ in range(ops):
        with timer.op():
            found = saver.get_tuple(config)
        assert found is not None and len(found.pending_writes or ()) == 3
    return timer.sample()


async def list100_async(side: Side, ops: int, tag: str) -> Sample:
    saver, config = side.async_saver, thread_config(f"{side.name}-list")
    timer = Timer(side.server_cpu)
    for _ in range(ops):
        with timer.op():
            got = [t async for t in saver.alist(config, limit=LIST_LIMIT)]
        assert len(got) == LIST_LIMIT
    return timer.sample()


def list100_sync(side: Side, ops: int, tag: str) -> Sample:
    saver, config = side.sync_saver, thread_config(f"{side.name}-list")
    timer = Timer(side.server_cpu)
    for _ in range(ops):
        with timer.op():
            got = list(saver.list(config, limit=LIST_LIMIT))
        assert len(got) == LIST_LIMIT
    return timer.sample()


# concurrency

CONCURRENCY = 8


async def concurrent_put8_async(side: Side, ops: int, tag: str) -> Sample:
    saver = side.async_saver
    per_task = max(1, ops // CONCURRENCY)
    inputs = [_put_inputs(saver, per_task) for _ in range(CONCURRENCY)]
    timer = Timer(side.server_cpu)

    async def one(k: int) -> None:
        config = thread_config(f"{side.name}-c8-{tag}-{k}")
        for ckpt, meta, versions in inputs[k]:
            t0 = time.perf_counter()
            config = await saver.aput(config, ckpt, meta, versions)  # type: ignore[arg-type]
            timer.add(time.perf_counter() - t0)

    await asyncio.gather(*(one(k) for k in range(CONCURRENCY)))
    return timer.sample()


WORKLOADS: list[Workload] = [
    Workload("graph_async", "10 nodes + 5-way Send fan-out, ~10 KB messages, "
             "durability=sync, ainvoke (runs/s)", 1.0, 10, 2, graph_async),
    Workload("graph_sync", "same graph, invoke (runs/s)", 1.0, 10, 2, graph_sync, sync=True),
    Workload("put_async", "aput of a 10 KB checkpoint", 0.9, 160, 20, put_async),
    Workload("put_sync", "put of a 10 KB checkpoint", 0.9, 160, 20, put_sync, sync=True),
    Workload("put_writes_async", "aput_writes, 2 writes (~500 B message + trigger)", 0.9,
             160, 20, put_writes_async),
    Workload("put_writes_sync", "put_writes, 2 writes", 0.9, 160, 20, put_writes_sync, sync=True),
    Workload("get_tuple_async", "aget_tuple latest (10 KB blob, 3 pending writes)", 0.9,
             200, 20, get_tuple_async),
    Workload("get_tuple_sync", "get_tuple latest", 0.9, 200, 20, get_tuple_sync, sync=True),
    Workload("list100_async", "alist(limit=100) of 10 KB checkpoints", 0.9, 5, 2,
             list100_async),
    Workload("list100_sync", "list(limit=100)", 0.9, 5, 2, list100_sync, sync=True),
    Workload("concurrent_put8_async", "8 tasks aput at once on one saver (ops/s)", 2.0,
             320, 40, concurrent_put8_async),
]  # fmt: skip
WORKLOAD_NAMES = [w.name for w in WORKLOADS]


# --- main -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="DeterministicSaver vs langgraph's Postgres savers, interleaved rounds."
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="measured rounds (default 11; 2 with --quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: few operations, 2 rounds, no warm-up"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="WORKLOAD",
        help=f"run only these (repeatable or comma-separated): {', '.join(WORKLOAD_NAMES)}",
    )
    parser.add_argument(
        "--pool-size", type=int, default=10, help="connections in each saver's pool (default 10)"
    )
    parser.add_argument(
        "--run-id-policy",
        default="require",
        choices=["require", "warn", "off"],
        help="our run_id_policy for graph runs (each run passes a run_id)",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="server to use (default $DATABASE_URL, else an embedded Postgres); "
        "two fresh databases are created on it and dropped at the end",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="cProfile every measured batch into DIR/<workload>.<side>.prof "
        "(slows everything: timings of a profiled run are not results)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply operations per round (e.g. 0.5 on a slow machine)",
    )
    args = parser.parse_args(argv)
    only = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = sorted(set(only) - set(WORKLOAD_NAMES))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {WORKLOAD_NAMES}")
    args.only = only
    if args.rounds is None:
        args.rounds = 2 if args.quick else 11
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


async def run_benchmark(
    args: argparse.Namespace, ours_dsn: str, peer_dsn: str
) -> list[WorkloadResult]:
    selected = [w for w in WORKLOADS if not args.only or w.name in args.only]
    env = await open_sides(ours_dsn, peer_dsn, args.pool_size, args.run_id_policy)
    profiler, no_profile = Profiler(args.profile_dir), Profiler(None)
    try:
        names = {w.name for w in selected}
        for side in env.sides.values():
            if names & {"get_tuple_async", "get_tuple_sync"}:
                await asyncio.to_thread(fill_thread, side.sync_saver, f"{side.name}-read",
                                        READ_THREAD_CHECKPOINTS)  # fmt: skip
            if names & {"list100_async", "list100_sync"}:
                await asyncio.to_thread(fill_thread, side.sync_saver, f"{side.name}-list",
                                        LIST_THREAD_CHECKPOINTS)  # fmt: skip

        results = {w.name: WorkloadResult(w.name, w.description, w.target) for w in selected}

        def n_ops(w: Workload) -> int:
            return int(max(1, round((w.quick_ops if args.quick else w.ops) * args.scale)))

        if not args.quick:  # warm-up: connections, prepared statements, imports, caches
            for w in selected:
                for name in SIDES:
                    await w.run(env.sides[name], max(1, n_ops(w) // 4), "warmup", no_profile)
        for r in range(args.rounds):
            started = time.perf_counter()
            for w in selected:
                for name in side_order(r):
                    gc.collect()
                    sample = await w.run(env.sides[name], n_ops(w), f"r{r}", profiler)
                    results[w.name].samples[name].append(sample)
            print(f"  round {r + 1}/{args.rounds} done in {time.perf_counter() - started:.1f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        for path in profiler.dump():
            print(f"  profile written: {path}", file=sys.stderr)
        return list(results.values())
    finally:
        await close_env(env)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    admin = args.database_url or os.environ.get("DATABASE_URL") or None
    if admin:
        os.environ["DATABASE_URL"] = admin
    url, server = ensure_database_url()
    databases: list[str] = []
    try:
        ours_dsn = create_database(url, prefix="lgd_bench_ours")
        databases.append(ours_dsn)
        peer_dsn = create_database(url, prefix="lgd_bench_peer")
        databases.append(peer_dsn)
        where = "embedded Postgres" if server is not None else redact_dsn(url)
        print(f"# bench_saver: DeterministicSaver (ours) vs langgraph PostgresSaver/"
              f"AsyncPostgresSaver (peer)\n# server: {where}; fresh databases "
              f"{database_name(ours_dsn)} / {database_name(peer_dsn)}; pool size "
              f"{args.pool_size} each; rounds {args.rounds}{' (quick)' if args.quick else ''}; "
              f"python {platform.python_version()}, {os.cpu_count()} CPUs", flush=True)  # fmt: skip
        started = time.perf_counter()
        results = asyncio.run(run_benchmark(args, ours_dsn, peer_dsn))
        print()
        print("ratio = median over rounds of (ours ops/s / peer ops/s), each round's pair run "
              "back to back; higher is better for us. 'rounds min-max' = spread of those ratios")  # fmt: skip
        print(format_table(results))
        below = [r.name for r in results if r.complete() and r.status() != "ok"]
        print(f"\n{len(results) - len(below)}/{len(results)} workloads at target"
              + (f"; below target: {', '.join(below)}" if below else "")
              + f"; total {time.perf_counter() - started:.0f} s")  # fmt: skip
        if args.json is not None:
            meta = {
                "rounds": args.rounds,
                "quick": args.quick,
                "pool_size": args.pool_size,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "time": datetime.now(UTC).isoformat(),
            }
            args.json.write_text(to_json(results, meta))
        return 0
    finally:
        for dsn in databases:
            drop_database(url, database_name(dsn))
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
