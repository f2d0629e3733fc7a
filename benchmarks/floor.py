"""The floor: what ANY Postgres checkpointer must pay for a graph run with
``durability="sync"``, measured beside InMemorySaver, DeterministicSaver and the peer.

Issue 13 asks for graph runs >= 0.5x InMemorySaver and >= 1.25x the peer one at a time,
and >= 2x the peer with 1 ms per round trip. This tool measures how far any Postgres saver
can get on this machine, with ``FloorSaver``: a checkpointer that does only what
``durability="sync"`` physically requires, so LangGraph can run bench_saver.py's graph on
it (10 sequential nodes, a 5-way ``Send`` fan-out and a join, ~10 KB of messages, 14
checkpoints per run counting the input step):

* per superstep ONE round trip and ONE durable commit: a psycopg pipeline (no Sync until
  the end, so Postgres runs it as one implicit transaction) carrying the changed channel
  blobs, the checkpoint row and the pending writes of the superstep that checkpoint ends;
* pending writes wait in memory for the put continuing their checkpoint, as our write
  buffer does (src/langgraph_deterministic/checkpointer/_writebuffer.py): special writes
  (error, interrupt, resume, scheduled) are stored at once with what waits beside them,
  and a write whose checkpoint already has its child (LangGraph does not order a task's
  ``put_writes`` before the next ``put``) is stored on its own. Unlike ours there is no
  window timer: a worker killed mid-superstep loses its finished siblings' writes (they run
  again), which ``durability="sync"`` allows; writes left without a child (only
  ``durability="exit"`` leaves those) are stored by ``flush()`` or the thread's next read;
* the peer's table layout (checkpoints / checkpoint_blobs / checkpoint_writes: the peer
  reads what it writes, checked before measuring), LangGraph's serde (JsonPlusSerializer)
  for blobs and writes, orjson for the two JSONB columns, binary parameters, statements
  prepared (the pool's ``prepare_threshold=0``);
* no run-id guard, no lease, no run ledger, no input fingerprint; ``get_tuple`` is one
  query (latest or by id, with blobs and writes), enough for a fresh thread per run.

Sides, interleaved in one process on the SAME pools (per network one sync and one async
pool of ``--pool-size`` connections with LangGraph's settings ``autocommit=True,
prepare_threshold=0, row_factory=dict_row``), order rotated every round:

* ``memory``        InMemorySaver (a fresh one per sample): the limit of the issue;
* ``serialise``     FloorSaver's client-side work without I/O (serde, JSON, parameters;
                    nothing stored): what serialisation itself costs;
* ``floor``         FloorSaver;
* ``floor_1stmt``   FloorSaver with ``one_statement=True``: the superstep as ONE statement
                    (a CTE inserting blobs and writes from arrays), no pipeline;
* ``floor_nosync``  FloorSaver with ``synchronous_commit=off`` per transaction (no wait
                    for the WAL flush; not durable: it isolates the flush's cost);
* ``ours``          DeterministicSaver, policy ``require``, config from ``run_config()``;
* ``peer``          PostgresSaver / AsyncPostgresSaver.

Workloads: ``graph_sync`` (invoke) and ``graph_async`` (ainvoke), one run at a time, each
``direct`` (the server's unix socket) and ``1ms`` (delay_proxy.py). Printed: runs/s, p50,
client CPU (this process) and server CPU (the pool's backends, /proc/PID/schedstat) per
run, exact round trips per run (libpq trace), WAL flushes, records and commits per run
(pg_stat_wal / pg_stat_database, one connection per side), and paired per-round ratios: floor vs
memory (the best any Postgres saver reaches against the 0.5x target), floor vs peer (the
best ratio reachable against the peer), ours vs floor (how far we are from the floor).

Run: ``python benchmarks/floor.py [--rounds 11] [--quick] [--json FILE]``
($DATABASE_URL, else an embedded Postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _src = Path(__file__).resolve().parents[1] / "src"
    if _src.is_dir():
        sys.path.insert(1, str(_src))
    import bench_graph as g
    import bench_saver as b
    import delay_proxy
    from cost_breakdown import trace_counts
    from harness import Sample, percentile
else:
    from . import bench_graph as g
    from . import bench_saver as b
    from . import delay_proxy
    from .cost_breakdown import trace_counts
    from .harness import Sample, percentile

import orjson
import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from devtools.postgres import create_database, database_name, drop_database, ensure_database_url
from langgraph_deterministic import DeterministicSaver

# --- FloorSaver -------------------------------------------------------------------------

INSERT_BLOB = """INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""
INSERT_CHECKPOINT = """INSERT INTO checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata"""
_WRITE_COLUMNS = """INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)"""
INSERT_WRITE = _WRITE_COLUMNS + " DO NOTHING"
UPSERT_WRITE = (
    _WRITE_COLUMNS
    + " DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob"
)
# The whole superstep as ONE statement (``one_statement=True``): blobs and writes as arrays.
PUT_ONE = """WITH blobs AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %(thread_id)s, %(ns)s, * FROM unnest(
        %(b_channel)s::text[], %(b_version)s::text[], %(b_type)s::text[], %(b_blob)b::bytea[])
    ON CONFLICT DO NOTHING
), writes AS (
    INSERT INTO checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(thread_id)s, %(ns)s, %(parent_id)s, * FROM unnest(
        %(w_task)s::text[], %(w_path)s::text[], %(w_idx)s::int4[], %(w_channel)s::text[],
        %(w_type)s::text[], %(w_blob)b::bytea[])
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
)
INSERT INTO checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
VALUES (%(thread_id)s, %(ns)s, %(checkpoint_id)s, %(parent_id)s, %(checkpoint)s, %(metadata)s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata"""
NO_FLUSH_WAIT = "SELECT set_config('synchronous_commit', 'off', true)"
_SELECT = """SELECT c.checkpoint_id, c.parent_checkpoint_id, c.checkpoint, c.metadata,
    bl.channels, bl.types, bl.blobs,
    w.task_ids, w.channels AS w_channels, w.types AS w_types, w.blobs AS w_blobs
FROM checkpoints c
LEFT JOIN LATERAL (
    SELECT array_agg(b.channel) AS channels, array_agg(b.type) AS types,
           array_agg(b.blob) AS blobs
    FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
    JOIN checkpoint_blobs b ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
        AND b.channel = v.key AND b.version = v.value
) AS bl ON true
LEFT JOIN LATERAL (
    SELECT array_agg(cw.task_id ORDER BY cw.task_path, cw.task_id, cw.idx) AS task_ids,
           array_agg(cw.channel ORDER BY cw.task_path, cw.task_id, cw.idx) AS channels,
           array_agg(cw.type ORDER BY cw.task_path, cw.task_id, cw.idx) AS types,
           array_agg(cw.blob ORDER BY cw.task_path, cw.task_id, cw.idx) AS blobs
    FROM checkpoint_writes cw
    WHERE cw.thread_id = c.thread_id AND cw.checkpoint_ns = c.checkpoint_ns
        AND cw.checkpoint_id = c.checkpoint_id
) AS w ON true
WHERE c.thread_id = %s AND c.checkpoint_ns = %s"""
SELECT_LATEST = _SELECT + " ORDER BY c.checkpoint_id DESC LIMIT 1"
SELECT_BY_ID = _SELECT + " AND c.checkpoint_id = %s"

# A statement and its parameter rows (executemany when more than one).
Statement = tuple[str, list[tuple[Any, ...]]]
Key = tuple[str, str, str]  # (thread_id, checkpoint_ns, checkpoint_id)


def _json(value: Any) -> Jsonb:
    """A JSONB parameter serialised now (orjson), so its cost lands where it is built."""
    return Jsonb(orjson.dumps(value), dumps=_as_is)


def _as_is(data: Any) -> Any:
    return data


class FloorSaver(BaseCheckpointSaver[str]):
    """A minimal Postgres checkpointer for ``durability="sync"`` benchmarks (not a
    product: no guard, no lease, no timer for writes left without a child). ``conn``: a
    psycopg (async) connection or pool with ``autocommit=True``. ``durable=False`` commits
    with ``synchronous_commit=off``; ``io=False`` does the client-side work only."""

    def __init__(
        self, conn: Any, *, durable: bool = True, io: bool = True, one_statement: bool = False
    ) -> None:
        super().__init__(serde=JsonPlusSerializer())
        self.conn, self.durable, self.io = conn, durable, io
        self.one_statement = one_statement
        self._lock = threading.Lock()  # the buffer; and a lone sync connection
        self._alock: asyncio.Lock | None = None  # a lone async connection
        self._waiting: dict[Key, list[tuple[str, tuple[Any, ...]]]] = {}
        self._sealed: dict[tuple[str, str], str] = {}  # newest checkpoint with a child
        self.stored_alone = 0  # writes that missed their put (counted, for the report)

    # -- statements (sans I/O, shared by both APIs) --

    def _put_statements(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[list[Statement], RunnableConfig]:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        parent_id = conf.get("checkpoint_id")
        stored = dict(checkpoint)
        inline = stored["channel_values"] = dict(checkpoint["channel_values"])
        blobs = []
        for channel, value in checkpoint["channel_values"].items():
            if value is None or isinstance(value, str | int | float | bool):
                continue
            del inline[channel]
            if channel in new_versions:
                blobs.append(
                    (thread_id, ns, channel, str(new_versions[channel]),
                     *self.serde.dumps_typed(value))
                )  # fmt: skip
        statements: list[Statement] = [] if self.durable else [(NO_FLUSH_WAIT, [()])]
        waiting = []
        if parent_id is not None:
            with self._lock:
                if parent_id > self._sealed.get((thread_id, ns), ""):
                    self._sealed[thread_id, ns] = parent_id
                waiting = self._waiting.pop((thread_id, ns, parent_id), [])
        ckpt_json = _json(stored)
        meta_json = _json(get_serializable_checkpoint_metadata(config, metadata))
        if self.one_statement:  # waiting writes are all plain inserts: specials never wait
            w = [params for _, params in waiting]
            one = {
                "thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint["id"],
                "parent_id": parent_id, "checkpoint": ckpt_json, "metadata": meta_json,
                "b_channel": [r[2] for r in blobs], "b_version": [r[3] for r in blobs],
                "b_type": [r[4] for r in blobs], "b_blob": [r[5] for r in blobs],
                "w_task": [r[3] for r in w], "w_path": [r[4] for r in w],
                "w_idx": [r[5] for r in w], "w_channel": [r[6] for r in w],
                "w_type": [r[7] for r in w], "w_blob": [r[8] for r in w],
            }  # fmt: skip
            statements.append((PUT_ONE, [one]))  # type: ignore[list-item]
        else:
            if blobs:
                statements.append((INSERT_BLOB, blobs))
            row = (thread_id, ns, checkpoint["id"], parent_id, ckpt_json, meta_json)
            statements.append((INSERT_CHECKPOINT, [row]))
            statements += _grouped(waiting)
        next_config: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint["id"]}
        }  # fmt: skip
        return statements, next_config

    def _write_statements(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> list[Statement]:
        """The statements to store now: [] when the writes wait for their put."""
        conf = config["configurable"]
        thread_id, ns, checkpoint_id = (
            conf["thread_id"],
            conf["checkpoint_ns"],
            conf["checkpoint_id"],
        )
        special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        sql = UPSERT_WRITE if special else INSERT_WRITE
        rows = [
            (sql, (thread_id, ns, checkpoint_id, task_id, path, WRITES_IDX_MAP.get(channel, i),
                   channel, *self.serde.dumps_typed(value)))
            for i, (channel, value) in enumerate(writes)
        ]  # fmt: skip
        key = (thread_id, ns, checkpoint_id)
        with self._lock:
            late = checkpoint_id <= self._sealed.get((thread_id, ns), "")
            if not (late or any(c in WRITES_IDX_MAP for c, _ in writes)):
                self._waiting.setdefault(key, []).extend(rows)
                return []
            if late:
                self.stored_alone += len(rows)
            else:  # a special write: later writes of its checkpoint go at once too
                self._sealed[thread_id, ns] = checkpoint_id
            rows = self._waiting.pop(key, []) + rows
        return _grouped(rows)

    def _leftovers(self, thread_id: str) -> list[Statement]:
        with self._lock:
            keys = [k for k in self._waiting if k[0] == thread_id]
            return _grouped([r for k in keys for r in self._waiting.pop(k)])

    def _read(self, config: RunnableConfig) -> tuple[str, tuple[Any, ...]]:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        if checkpoint_id := get_checkpoint_id(config):
            return SELECT_BY_ID, (thread_id, ns, checkpoint_id)
        return SELECT_LATEST, (thread_id, ns)

    def _tuple(self, config: RunnableConfig, row: dict[str, Any] | None) -> CheckpointTuple | None:
        if row is None:
            return None
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        checkpoint = row["checkpoint"]
        values = dict(checkpoint.get("channel_values") or {})
        for channel, type_, blob in zip(
            row["channels"] or (), row["types"] or (), row["blobs"] or (), strict=True
        ):
            if type_ != "empty":
                values[channel] = self.serde.loads_typed((type_, blob))
        writes = [
            (task_id, channel, self.serde.loads_typed((type_, blob)))
            for task_id, channel, type_, blob in zip(
                row["task_ids"] or (), row["w_channels"] or (), row["w_types"] or (),
                row["w_blobs"] or (), strict=True,
            )
        ]  # fmt: skip
        parent = row["parent_checkpoint_id"]
        return CheckpointTuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                              "checkpoint_id": row["checkpoint_id"]}},
            {**checkpoint, "channel_values": values},
            row["metadata"],
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                              "checkpoint_id": parent}} if parent else None,
            writes,
        )  # fmt: skip

    def get_next_version(self, current: str | None, channel: None) -> str:
        n = 0 if current is None else int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    # -- sync driver --

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                yield conn
        else:
            with self._lock:
                yield self.conn

    def _store(self, statements: list[Statement]) -> None:
        """One round trip, one commit (the pipeline's implicit transaction)."""
        if not statements or not self.io:
            return
        if len(statements) == 1 and len(statements[0][1]) == 1:  # no pipeline needed
            with self._connection() as conn, conn.cursor(binary=True) as cur:
                cur.execute(statements[0][0], statements[0][1][0])
            return
        with self._connection() as conn, conn.pipeline(), conn.cursor(binary=True) as cur:
            for sql, rows in statements:
                if len(rows) == 1:
                    cur.execute(sql, rows[0])
                else:
                    cur.executemany(sql, rows)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if not self.io:
            return None
        self._store(self._leftovers(config["configurable"]["thread_id"]))
        sql, params = self._read(config)
        with self._connection() as conn, conn.cursor(binary=True, row_factory=dict_row) as cur:
            row = cur.execute(sql, params).fetchone()
        return self._tuple(config, row)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        statements, next_config = self._put_statements(config, checkpoint, metadata, new_versions)
        self._store(statements)
        return next_config

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._store(self._write_statements(config, writes, task_id, task_path))

    def flush(self, thread_id: str) -> None:
        self._store(self._leftovers(thread_id))

    # -- async driver --

    @asynccontextmanager
    async def _aconnection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                yield conn
        else:
            self._alock = self._alock or asyncio.Lock()
            async with self._alock:
                yield self.conn

    async def _astore(self, statements: list[Statement]) -> None:
        if not statements or not self.io:
            return
        if len(statements) == 1 and len(statements[0][1]) == 1:  # no pipeline needed
            async with self._aconnection() as conn, conn.cursor(binary=True) as cur:
                await cur.execute(statements[0][0], statements[0][1][0])
            return
        async with (
            self._aconnection() as conn,
            conn.pipeline(),
            conn.cursor(binary=True) as cur,
        ):
            for sql, rows in statements:
                if len(rows) == 1:
                    await cur.execute(sql, rows[0])
                else:
                    await cur.executemany(sql, rows)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if not self.io:
            return None
        await self._astore(self._leftovers(config["configurable"]["thread_id"]))
        sql, params = self._read(config)
        async with (
            self._aconnection() as conn,
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            await cur.execute(sql, params)
            row = await cur.fetchone()
        return self._tuple(config, row)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        statements, next_config = self._put_statements(config, checkpoint, metadata, new_versions)
        await self._astore(statements)
        return next_config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._astore(self._write_statements(config, writes, task_id, task_path))


def _grouped(rows: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Statement]:
    """(sql, params) rows to one executemany per statement, in first-seen order."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for sql, params in rows:
        out.setdefault(sql, []).append(params)
    return list(out.items())


# --- the benchmark ----------------------------------------------------------------------

FLOOR_SIDES: dict[str, dict[str, bool]] = {
    "serialise": {"io": False},
    "floor": {},
    "floor_1stmt": {"one_statement": True},
    "floor_nosync": {"durable": False},
}
SIDES = ("memory", "serialise", "floor", "floor_1stmt", "floor_nosync", "ours", "peer")
FLOORS = ("floor", "floor_1stmt")  # the floor is the better of the two
WORKLOADS = [w for w in g.WORKLOADS if w.concurrency == 1]  # graph_sync, graph_async
NETS = g.NETS
# (numerator, denominator, what it shows)
RATIOS = [
    ("floor", "memory", "best any Postgres saver reaches vs InMemorySaver (target >= 0.5x)"),
    ("floor_1stmt", "memory", "same, the superstep as one statement (arrays)"),
    ("floor_nosync", "memory", "same without waiting for the WAL flush (not durable)"),
    ("floor", "peer", "best ratio reachable vs the peer (targets 1.25x direct, 2x at 1ms)"),
    ("ours", "floor", "ours vs the floor (1.00x = at the floor)"),
    ("ours", "peer", "ours vs the peer (as bench_graph.py)"),
    ("serialise", "memory", "serialisation only vs InMemorySaver"),
]


@dataclass
class Cell:
    workload: Any  # bench_graph.Workload
    net: str
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {s: [] for s in SIDES})

    def ratios(self, num: str, den: str) -> list[float]:
        return [
            a.ops_per_s / z.ops_per_s
            for a, z in zip(self.samples[num], self.samples[den], strict=True)
        ]

    def rps(self, side: str) -> float:
        return statistics.median(s.ops_per_s for s in self.samples[side])

    def p50_ms(self, side: str) -> float:
        return percentile([x for s in self.samples[side] for x in s.latencies], 50) * 1e3

    def cpu_ms(self, side: str) -> tuple[float, float]:
        """(client, server) CPU ms per run, medians over rounds."""
        s = self.samples[side]
        cli = statistics.median(x.client_cpu_s * 1e3 / x.ops for x in s)
        srv = statistics.median((x.server_cpu_s or 0.0) * 1e3 / x.ops for x in s)
        return cli, srv


def add_floor_graphs(net: Any) -> None:
    """FloorSaver sides on the network's shared pools (the peer's)."""
    pool, apool = net.pools[0], net.pools[1]
    for side, kwargs in FLOOR_SIDES.items():
        for sync in (True, False):
            saver = FloorSaver(pool if sync else apool, **kwargs)
            net.graphs[side, sync] = b.build_graph(not sync).compile(checkpointer=saver)


def check_floor(dsn: str) -> list[str]:
    """Before measuring: the floor stores what the peer stores and reads back (the peer's
    layout), its commit really skips the flush wait when asked, and its get_tuple reads a
    thread back. Returns lines for the header; raises if anything is off."""
    notes = []
    with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
        counts = {}
        for side in ("floor", "floor_1stmt", "peer"):
            saver: Any = (
                FloorSaver(conn, **FLOOR_SIDES[side]) if side in FLOORS else PostgresSaver(conn)
            )
            graph = b.build_graph(False).compile(checkpointer=saver)
            config = b.graph_config(side)
            graph.invoke(b.graph_input(), config, durability="sync")
            thread_id = config["configurable"]["thread_id"]
            counts[side] = tuple(
                conn.execute(
                    f"SELECT count(*) AS n FROM {table} WHERE thread_id = %s",
                    (thread_id,),
                ).fetchone()["n"]  # type: ignore[index]
                for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
            )
            for reader in (PostgresSaver(conn), FloorSaver(conn)):  # type: ignore[arg-type]
                head = reader.get_tuple({"configurable": {"thread_id": thread_id}})
                assert head is not None, (side, reader)
                got = len(head.checkpoint["channel_values"]["messages"])
                assert got == b.EXPECTED_MESSAGES, (side, type(reader).__name__, got)
            if side == "floor":  # a second run on the thread resumes from the floor's head
                again = {**config, "metadata": {"run_id": "second"}}
                again["configurable"] = {**config["configurable"], "run_id": "second"}
                more = graph.invoke(b.graph_input(), again, durability="sync")
                assert len(more["messages"]) == 2 * b.EXPECTED_MESSAGES, len(more["messages"])
        if not counts["floor"] == counts["floor_1stmt"] == counts["peer"]:
            raise AssertionError(f"a floor stores other rows than the peer: {counts}")
        notes.append(
            f"rows per run (checkpoints, blobs, writes): floor {counts['floor']} = floor_1stmt "
            f"{counts['floor_1stmt']} = peer {counts['peer']}; each reads the other's threads"
        )
        with conn.pipeline() as pipe, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(NO_FLUSH_WAIT)
            cur.execute("SHOW synchronous_commit")
            pipe.sync()
            inside = cur.fetchone()
        after = conn.cursor(row_factory=tuple_row).execute("SHOW synchronous_commit").fetchone()
        if inside is None or after is None or inside[0] != "off" or after[0] == "off":
            raise AssertionError(f"synchronous_commit in/after the pipeline: {inside} {after}")
        notes.append(
            "floor_nosync: synchronous_commit is off inside its transaction only "
            f"(after it: {after[0]})"
        )
    return notes


def traced_round_trips(dsn: str, policy: str) -> dict[str, dict[str, float]]:
    """Exact protocol counts of one sync graph run per Postgres side on one connection."""
    out = {}
    for side in ("floor", "floor_1stmt", "floor_nosync", "ours", "peer"):
        with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
            if side in FLOOR_SIDES:
                saver: Any = FloorSaver(conn, **FLOOR_SIDES[side])
                graph = b.build_graph(False).compile(checkpointer=saver)
            else:
                graph = b.compile_graph(side, conn, policy=policy)
            for _ in range(2):
                graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")
            config = b.graph_config(side)
            out[side] = trace_counts(
                conn, partial(graph.invoke, b.graph_input(), config, durability="sync")
            )
    return out


def _wal_counters(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    """(WAL fsyncs, WAL records, WAL bytes, commits) so far, this backend's stats flushed
    first (a backend reports them at most once a second, or when forced)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = (
        conn.cursor(row_factory=tuple_row)
        .execute(
            "SELECT w.wal_sync, w.wal_records, w.wal_bytes, d.xact_commit FROM pg_stat_wal w, "
            "pg_stat_database d WHERE d.datname = current_database()"
        )
        .fetchone()
    )
    assert row is not None
    return tuple(int(x) for x in row)


def wal_counts(dsn: str, policy: str, runs: int) -> dict[str, dict[str, float]]:
    """WAL flushes, records, bytes and commits per sync graph run of each Postgres side,
    on one connection (server-wide WAL counters: the benchmark's server must be idle
    otherwise). Counts, not timings: they do not move with the machine's load."""
    out = {}
    names = ("wal_flushes", "wal_records", "wal_kb", "commits")
    for side in ("floor", "floor_1stmt", "floor_nosync", "ours", "peer"):
        with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
            if side in FLOOR_SIDES:
                graph = b.build_graph(False).compile(
                    checkpointer=FloorSaver(conn, **FLOOR_SIDES[side])
                )
            else:
                graph = b.compile_graph(side, conn, policy=policy)
            graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")
            before = _wal_counters(conn)
            for _ in range(runs):
                graph.invoke(b.graph_input(), b.graph_config(side), durability="sync")
            after = _wal_counters(conn)
        # the counter reads are 2 commits of their own (no WAL)
        diff = [(a - z) / runs for a, z in zip(after, before, strict=True)]
        diff[2] /= 1024
        diff[3] -= 2 / runs
        out[side] = dict(zip(names, diff, strict=True))
    return out


async def run_rounds(args: argparse.Namespace, nets: dict[str, Any]) -> list[Cell]:
    cells = [Cell(w, n) for w in WORKLOADS for n in args.nets]
    ops = 1 if args.quick else args.runs
    if not args.quick:
        for c in cells:
            for side in SIDES:
                await g.run_sample(c.workload, nets[c.net], side, 2)
    for r in range(args.rounds):
        started = time.perf_counter()
        order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
        for c in cells:
            for side in order:
                gc.collect()
                c.samples[side].append(await g.run_sample(c.workload, nets[c.net], side, ops))
        print(f"  round {r + 1}/{args.rounds} done in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return cells


def format_sides(cells: Sequence[Cell]) -> str:
    head = (
        f"{'workload':<12} {'net':<6} {'side':<13} {'runs/s':>7} {'p50 ms':>7} "
        f"{'cli ms':>7} {'srv ms':>7} {'cli+srv':>8}"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        for side in SIDES:
            cli, srv = c.cpu_ms(side)
            lines.append(
                f"{c.workload.name:<12} {c.net:<6} {side:<13} {c.rps(side):>7.1f} "
                f"{c.p50_ms(side):>7.2f} {cli:>7.2f} {srv:>7.2f} {cli + srv:>8.2f}"
            )
    return "\n".join(lines)


def format_ratios(cells: Sequence[Cell]) -> str:
    head = f"{'ratio':<22} " + " ".join(f"{f'{c.workload.name} {c.net}':>24}" for c in cells)
    lines = [head, "-" * len(head)]
    for num, den, what in RATIOS:
        row = []
        for c in cells:
            rr = c.ratios(num, den)
            row.append(f"{statistics.median(rr):.2f}x ({min(rr):.2f}-{max(rr):.2f})")
        lines.append(f"{f'{num}/{den}':<22} " + " ".join(f"{x:>24}" for x in row) + f"  {what}")
    return "\n".join(lines)


def verdicts(cells: Sequence[Cell]) -> list[str]:
    """Each target of issue 13 against the floor: reachable by any Postgres saver or not."""
    out = []
    targets = {("direct", "memory"): 0.5, ("direct", "peer"): 1.25, ("1ms", "peer"): 2.0}
    for c in cells:
        for (net, other), target in targets.items():
            if c.net != net:
                continue
            best = max(statistics.median(c.ratios(f, other)) for f in FLOORS)
            ours = statistics.median(c.ratios("ours", other))
            state = "reachable" if best >= target else "OUT OF REACH (the floor is below it)"
            out.append(
                f"  {c.workload.name} {net}: vs {other} >= {target}x: floor {best:.2f}x -> "
                f"{state}; ours {ours:.2f}x = {ours / best:.0%} of the floor's ratio"
            )
        if c.net == "direct":
            fc, pc, oc = (sum(c.cpu_ms(s)) for s in ("floor", "peer", "ours"))
            state = "reachable" if fc / pc <= 0.8 else "OUT OF REACH (the floor is above it)"
            out.append(
                f"  {c.workload.name} direct: CPU (cli+srv) <= 0.8x the peer's: floor "
                f"{fc:.1f} / peer {pc:.1f} ms = {fc / pc:.2f}x -> {state}; ours {oc / pc:.2f}x"
            )
    return out


def budgets(
    cells: Sequence[Cell],
    steps: int,
    added_rtt: float | None,
    traced: dict[str, dict[str, float]],
    wal: dict[str, dict[str, float]],
) -> list[str]:
    """What each wall-clock target leaves a saver per run, against what the floor spends:
    the argument behind the verdicts, in the terms that explain it."""
    by = {(c.workload.name, c.net): c for c in cells}
    out = []
    for (name, net), c in by.items():
        if net == "direct":
            mem, (f_cli, f_srv) = c.p50_ms("memory"), c.cpu_ms("floor")
            m_cli = c.cpu_ms("memory")[0]
            out.append(
                f"  {name} direct, >= 0.5x memory: a run may take {2 * mem:.2f} ms "
                f"(memory's p50 {mem:.2f} x 2); the floor's CPU alone is {f_cli + f_srv:.2f} ms "
                f"(client {f_cli:.2f}, of which the engine and serde {m_cli:.2f}; server "
                f"{f_srv:.2f}), before {steps} durable commits "
                f"({c.p50_ms('floor') - c.p50_ms('floor_nosync'):.2f} ms of flush waits)"
            )
        elif added_rtt is not None and (direct := by.get((name, "direct"))) is not None:
            allowed = c.p50_ms("peer") / 2
            rts = (steps + 1) * added_rtt
            out.append(
                f"  {name} 1ms, >= 2x the peer: a run may take {allowed:.2f} ms (peer's p50 "
                f"{c.p50_ms('peer'):.2f} / 2); {steps + 1} serial round trips take {rts:.2f} "
                f"ms, leaving {allowed - rts:.2f} ms; the floor's direct run takes "
                f"{direct.p50_ms('floor_nosync'):.2f} ms without flush waits, "
                f"{direct.p50_ms('floor'):.2f} ms with them (at 1ms: {c.p50_ms('floor'):.2f})"
            )
            # Serial model: CPU + round trips x R + WAL flushes x F, from this run's counts
            # (exact), CPU (direct) and flush wait F (floor - floor_nosync at 1ms).
            flush = max(0.0, (c.p50_ms("floor") - c.p50_ms("floor_nosync")) / steps)
            cost = {
                s: sum(direct.cpu_ms(s)) + traced[s]["rt"] * added_rtt
                + wal[s]["wal_flushes"] * flush
                for s in ("floor", "peer")
            }  # fmt: skip
            need = (
                cost["peer"] / 2
                - traced["floor"]["rt"] * added_rtt
                - wal["floor"]["wal_flushes"] * max(flush, 0.0)
            )
            out.append(
                f"    serial model (CPU + round trips x {added_rtt:.2f} + flushes x "
                f"{flush:.2f} ms): floor {cost['floor']:.1f}, peer {cost['peer']:.1f} ms -> "
                f"floor/peer <= {cost['peer'] / cost['floor']:.2f}x; 2x needs the floor's CPU "
                f"<= {need:.1f} ms per run (it is {sum(direct.cpu_ms('floor')):.1f}; memory's "
                f"{direct.cpu_ms('memory')[0]:.1f}); with no CPU at all "
                f"{(cost['peer'] - sum(direct.cpu_ms('peer'))) / (cost['floor'] - sum(direct.cpu_ms('floor'))):.2f}x"
            )
    return out


def breakdown(cells: Sequence[Cell], steps: int) -> list[str]:
    """Where the floor's p50 goes, direct: the graph engine (memory), serialisation,
    psycopg + server work (floor_nosync), the WAL flush waits (floor)."""
    out = []
    for c in cells:
        if c.net != "direct":
            continue
        p = {s: c.p50_ms(s) for s in SIDES}
        flushes = steps  # one durable commit per checkpoint
        out.append(
            f"  {c.workload.name}: memory {p['memory']:.2f} ms; + serialisation "
            f"{p['serialise'] - p['memory']:+.2f} = {p['serialise']:.2f}; + psycopg, round trips "
            f"and server work {p['floor_nosync'] - p['serialise']:+.2f} = {p['floor_nosync']:.2f}"
            f"; + WAL flush waits {p['floor'] - p['floor_nosync']:+.2f} = {p['floor']:.2f} ms "
            f"({(p['floor'] - p['floor_nosync']) / flushes * 1e3:.0f} us per commit, "
            f"{flushes:.0f} commits); 0.5x memory needs <= {2 * p['memory']:.2f} ms"
        )
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 11; 2 with --quick")
    parser.add_argument("--runs", type=int, default=8, help="graph runs per sample")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run per sample")
    parser.add_argument("--nets", default="direct,1ms", help="comma-separated subset of direct,1ms")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="proxy delay per round trip")
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--wal-runs", type=int, default=None, help="default 10; 2 with --quick")
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    args.nets = [n for n in args.nets.split(",") if n]
    if not args.nets or set(args.nets) - set(NETS):
        parser.error(f"--nets takes a subset of {list(NETS)}")
    if args.rounds is None:
        args.rounds = 2 if args.quick else 11
    if args.wal_runs is None:
        args.wal_runs = 2 if args.quick else 10
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    policy = "require"
    url, server = ensure_database_url()
    databases: list[str] = []
    stop_proxy = None
    load_before = os.getloadavg()
    try:
        dsn = create_database(url, prefix="lgd_floor")
        databases.append(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            DeterministicSaver(conn).setup()
        with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
            PostgresSaver(conn).setup()  # type: ignore[arg-type]
        dsns = {"direct": dsn}
        if "1ms" in args.nets:
            unix, host, port = g.unix_socket(dsn)
            proxy_port, stop_proxy = delay_proxy.start(
                unix=unix, host=host, port=port, rtt_ms=args.rtt_ms
            )
            dsns["1ms"] = make_conninfo(dsn, host="127.0.0.1", port=str(proxy_port))
        rtt = {n: g.measured_rtt_ms(dsns[n]) for n in args.nets}
        refused = g.ours_takes_langgraph_settings(dsn, policy)
        if refused is not None:
            raise SystemExit(f"DeterministicSaver fails on LangGraph's pool settings: {refused}")
        notes = check_floor(dsn)
        steps = g.supersteps_per_run()
        traced = traced_round_trips(dsn, policy)
        wal = wal_counts(dsn, policy, args.wal_runs)
        print(
            "# floor.py: FloorSaver (one round trip + one commit per superstep) vs "
            "InMemorySaver, DeterministicSaver (policy require, run_config), "
            f"PostgresSaver/AsyncPostgresSaver\n# one database, every Postgres side on the SAME "
            f"pool per network (size {args.pool_size}, LangGraph's settings); rounds "
            f"{args.rounds}{' (quick)' if args.quick else f', {args.runs} runs per sample'}; "
            f"python {platform.python_version()}, {os.cpu_count()} CPUs; load average "
            f"{load_before[0]:.2f}\n# SELECT 1 round trip: "
            + ", ".join(f"{n} {rtt[n]:.3f} ms" for n in args.nets)
            + "".join(f"\n# {n}" for n in notes),
            flush=True,
        )

        alone: dict[str, int] = {}

        async def go() -> list[Cell]:
            nets = {
                n: await g.open_net(n, dsns[n], args.pool_size, policy, True) for n in args.nets
            }
            try:
                for net in nets.values():
                    add_floor_graphs(net)
                cells = await run_rounds(args, nets)
                for (side, _), graph in (kv for net in nets.values() for kv in net.graphs.items()):
                    if side in FLOORS:
                        alone[side] = alone.get(side, 0) + graph.checkpointer.stored_alone
                return cells
            finally:
                for net in nets.values():
                    await g.close_net(net)

        cells = asyncio.run(go())
        load_after = os.getloadavg()
        print(
            "\nper side: runs/s median over rounds; p50 of one run; CPU per run (medians): "
            "cli = this process, srv = the pool's Postgres backends"
        )
        print(format_sides(cells))
        print("\nratios: median over rounds of the paired runs/s ratio (spread min-max)")
        print(format_ratios(cells))
        print(f"\nround trips (libpq trace, one sync run on one connection, {steps} checkpoints):")
        for side, t in traced.items():
            print(
                f"  {side:<13} {t['rt']:>3.0f} round trips = {t['rt'] / steps:.2f}/superstep; "
                f"{t['stmts']:.0f} statements, {t['kb_out']:.1f} KB sent"
            )
        measured_runs = sum(len(x.latencies) for c in cells for x in c.samples["floor"])
        print(
            "  writes that lost the race to their put (stored on their own) while measuring: "
            + ", ".join(f"{s} {n} in {measured_runs} runs" for s, n in alone.items())
        )
        print(f"\nWAL per sync graph run (one connection per side, {args.wal_runs} runs):")
        for side, w in wal.items():
            print(
                f"  {side:<13} {w['wal_flushes']:>5.1f} WAL flushes  {w['wal_records']:>5.0f} "
                f"records  {w['wal_kb']:>6.1f} KB  {w['commits']:>5.1f} commits"
            )
        print("\nwhere the floor's time goes (p50, direct):")
        print("\n".join(breakdown(cells, steps)))
        added = rtt["1ms"] - rtt["direct"] if {"1ms", "direct"} <= set(args.nets) else None
        print("\nwhat each target leaves a run, against the floor:")
        print("\n".join(budgets(cells, steps, added, traced, wal)))
        print("\nissue 13's targets against the floor:")
        print("\n".join(verdicts(cells)))
        print(f"\nload average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
        if args.json is not None:
            args.json.write_text(json.dumps({
                "meta": {"rounds": args.rounds, "quick": args.quick, "rtt_ms": rtt,
                         "supersteps": steps, "load": [load_before[0], load_after[0]]},
                "round_trips": traced,
                "wal": wal,
                "writes_stored_alone": alone,
                "cells": [{
                    "workload": c.workload.name, "net": c.net,
                    "runs_per_s": {s: c.rps(s) for s in SIDES},
                    "p50_ms": {s: c.p50_ms(s) for s in SIDES},
                    "cpu_ms": {s: c.cpu_ms(s) for s in SIDES},
                    "ratios": {f"{n}/{d}": c.ratios(n, d) for n, d, _ in RATIOS},
                    "rounds": len(c.samples["floor"]),
                } for c in cells],
            }, indent=2))  # fmt: skip
        return 0
    finally:
        if stop_proxy is not None:
            stop_proxy()
        for d in databases:
            drop_database(url, database_name(d))
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
