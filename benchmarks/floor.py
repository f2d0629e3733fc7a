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
* ``floor_fenced``  FencedFloorSaver: the floor plus the least work that keeps the retry
                    contract's commit-time guarantees (see its docstring for what it keeps
                    and what not): the admission and the run's ledger row ride in the
                    head read; per superstep one more statement in the same pipeline
                    locks and renews the thread's lease and claims the parent's one child
                    slot (lgd_chain); the release rides on the next statement sent.
                    Checked before measuring (a zombie's fork, a run beside a live lease,
                    a write after a takeover: all refused). The contract's floor;
* ``floor_fenced_1stmt``  the same guard as CTEs of floor_1stmt's one statement;
* ``ours``          DeterministicSaver, policy ``require``, config from ``run_config()``;
* ``peer``          PostgresSaver / AsyncPostgresSaver.

Workloads: ``graph_sync`` (invoke) and ``graph_async`` (ainvoke), one run at a time, and
``graph_async_c32`` (32 tasks running graphs at once through one shared saver over the
pool, as bench_graph.py; sides memory, floor, floor_fenced, ours, peer), each ``direct``
(the server's unix socket) and ``1ms`` (delay_proxy.py). Printed: runs/s, p50, client CPU
(this process) and server CPU (the pool's backends, /proc/PID/schedstat) per run, the
delay proxy's CPU per run (its process, /proc/PID/stat: it shares the cores, a real
network would not), what bounds runs/s at C=32 (one core for the asyncio client, the
machine's cores for all three), exact round trips per run (libpq trace), WAL flushes, records and commits per run
(pg_stat_wal / pg_stat_database, one connection per side), and paired per-round ratios: floor vs
memory (the best any Postgres saver reaches against the 0.5x target), floor vs peer (the
best ratio reachable against the peer), floor_fenced vs peer and memory (the same for
any saver keeping the contract), ours vs floor_fenced (our real headroom); and a verdict
per target: reachable or out of reach, for any saver and keeping the contract.

Run: ``python benchmarks/floor.py [--rounds 11] [--quick] [--workloads ...] [--json FILE]``
($DATABASE_URL, else an embedded Postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
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
from langchain_core.callbacks import BaseCallbackHandler, CallbackManager
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
from langgraph_deterministic._compat.langgraph import CONFIG_KEY_RUNTIME  # a graph run's mark
from langgraph_deterministic.errors import ThreadBusyError

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
Statement = tuple[str, list[Any]]  # positional tuples, or one dict of named ones
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
            statements.append((PUT_ONE, [one]))
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
            {**checkpoint, "channel_values": values},  # type: ignore[typeddict-item]
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


# --- FencedFloorSaver: the floor plus the retry contract's commit-time guarantees ----------

# The releases of this process's finished runs ride in the pipeline of the next statement
# the saver sends (its round trip and transaction). A statement of their own, not a CTE of
# every guard: a CTE updating from unnest(array parameter) made Postgres plan each guard
# anew (the generic plan's estimate for the array looks dearer than a custom one), 150 us
# of server CPU per superstep instead of 50.
RELEASE = """UPDATE lgd_leases SET ended = 'ok', expires_at = now()
WHERE thread_id = %(thread_id)s AND attempt = %(attempt)s AND ended IS NULL"""
# The lease row, locked (FOR NO KEY UPDATE, held to commit): an admission taking the
# thread over (FOR UPDATE) waits for this write's commit, or this write sees its result.
# Renewed when it is the writer's run's; what it says is read from the locked row, not
# from the statement's snapshot.
_LEASE = """lease AS (
    UPDATE lgd_leases l SET expires_at = CASE
        WHEN l.run_id = %(run_id)s::text AND l.ended IS NULL THEN now() + l.ttl
        ELSE l.expires_at END
    WHERE l.thread_id = %(thread_id)s
    RETURNING l.run_id = %(run_id)s::text AND l.ended IS NULL AS mine,
              l.ended IS NULL AND l.expires_at > now() AS live, l.run_id, l.outcome
)"""
_LEASE_OK = """lease.live IS NOT TRUE OR lease.mine IS TRUE
   OR lgd_refuse_v6('LG413', 'lgd: thread leased by another run',
                    format('run %%s holds thread %%s (%%s)', lease.run_id, %(thread_id)s,
                           lease.outcome))"""
# The superstep's guard: the lease, then the parent's one child slot (lgd_chain's key: a
# second child of the same parent, a zombie's or a race loser's, is refused; the same
# write again is not). First statement of the superstep's pipeline: a refusal aborts the
# implicit transaction, so the blobs, checkpoint and writes behind it are not stored.
_CLAIM = f"""INSERT INTO lgd_chain
    (thread_id, checkpoint_ns, parent_checkpoint_id, checkpoint_id, run_id, attempt)
SELECT %(thread_id)s, %(ns)s, %(slot)s, %(checkpoint_id)s, %(run_id)s, %(attempt)s
FROM (SELECT 1) AS one LEFT JOIN lease ON true
WHERE {_LEASE_OK}
ON CONFLICT (thread_id, checkpoint_ns, parent_checkpoint_id)
DO UPDATE SET checkpoint_id = EXCLUDED.checkpoint_id
WHERE lgd_chain.checkpoint_id = EXCLUDED.checkpoint_id
   OR lgd_refuse_v6('LG409', 'lgd: checkpoint already continued by another attempt',
                    format('checkpoint %%s was already continued by %%s of run %%s',
                           EXCLUDED.parent_checkpoint_id, lgd_chain.checkpoint_id,
                           coalesce(lgd_chain.run_id, '(no run id)')))"""
GUARD_PUT = f"WITH {_LEASE}\n{_CLAIM}"
# floor_fenced_1stmt: the guard and floor_1stmt's superstep in ONE statement (CTEs).
PUT_ONE_FENCED = f"WITH {_LEASE}, chain AS (\n{_CLAIM}\n), " + PUT_ONE.removeprefix(
    "WITH "
)
# Writes stored without their checkpoint's child (special writes, late ones): the lease,
# and the fence: refused if another attempt already continued their checkpoint.
GUARD_WRITES = f"""WITH {_LEASE}
SELECT 1 FROM (SELECT 1) AS one LEFT JOIN lease ON true
WHERE NOT ({_LEASE_OK})
   OR EXISTS (
       SELECT 1 FROM lgd_chain ch
       WHERE ch.thread_id = %(thread_id)s AND ch.checkpoint_ns = %(ns)s
         AND ch.parent_checkpoint_id = %(slot)s AND ch.attempt IS DISTINCT FROM %(attempt)s
         AND lgd_refuse_v6('LG410', 'lgd: checkpoint already continued by another attempt',
                           format('checkpoint %%s was continued by %%s', %(slot)s,
                                  ch.checkpoint_id)))"""
_SELECT_NAMED = _SELECT.replace("%s", "%(thread_id)s", 1).replace("%s", "%(ns)s", 1)
# A graph run's start, in its head read: take the thread's lease (free, released, expired,
# held by this run's earlier attempt, or by an attempt this process finished and has not
# released yet), write the run's ledger row (once per attempt), close the previous
# holder's row ('done': its call returned), read the head. Busy: nothing written.
ADMIT_READ = f"""WITH prev AS (
    SELECT l.run_id, l.attempt, l.ended FROM lgd_leases l WHERE l.thread_id = %(thread_id)s
), lease AS (
    INSERT INTO lgd_leases AS l
        (thread_id, run_id, attempt, strategy, outcome, ttl, expires_at)
    VALUES (%(thread_id)s, %(run_id)s, %(attempt)s, 'reject', 'free',
            make_interval(secs => %(ttl)s), now() + make_interval(secs => %(ttl)s))
    ON CONFLICT (thread_id) DO UPDATE SET
        run_id = EXCLUDED.run_id, attempt = EXCLUDED.attempt, ttl = EXCLUDED.ttl,
        outcome = CASE WHEN l.run_id = EXCLUDED.run_id THEN 'retry' ELSE 'free' END,
        acquired_at = now(), expires_at = EXCLUDED.expires_at, ended = NULL
    WHERE l.run_id = EXCLUDED.run_id OR l.ended IS NOT NULL OR l.expires_at <= now()
       OR l.attempt = %(freed)s::text
    RETURNING l.thread_id
), ledger AS (
    INSERT INTO lgd_runs AS r (thread_id, run_id, status, attempts, last_attempt,
                               first_checkpoint_id, last_checkpoint_id,
                               multitask_strategy, multitask_outcome)
    SELECT %(thread_id)s, %(run_id)s, 'running', 1, %(attempt)s, '', '', 'reject', 'free'
    FROM lease
    ON CONFLICT (thread_id, run_id) DO UPDATE SET
        attempts = r.attempts + 1, last_attempt = EXCLUDED.last_attempt, updated_at = now()
    WHERE r.status = 'running'
), closed AS (
    UPDATE lgd_runs r SET status = 'done', superseded_by = %(run_id)s, updated_at = now()
    FROM prev
    WHERE r.thread_id = %(thread_id)s AND r.run_id = prev.run_id
      AND prev.run_id <> %(run_id)s AND r.status = 'running'
      AND (prev.ended = 'ok' OR prev.attempt = %(freed)s::text)
      AND EXISTS (SELECT 1 FROM lease)
)
SELECT EXISTS (SELECT 1 FROM lease) AS admitted,
       (SELECT r.status FROM lgd_runs r
        WHERE r.thread_id = %(thread_id)s AND r.run_id = %(run_id)s) AS run_status,
       head.*
FROM (SELECT 1) AS one
LEFT JOIN LATERAL ({_SELECT_NAMED}
    ORDER BY c.checkpoint_id DESC LIMIT 1) AS head ON true"""


class _RunEnd(BaseCallbackHandler):
    """Hears a graph call's root chain end (a non-inheritable handler: no call per node)
    and tells the saver that admitted it. Inline: no executor hop in async runs."""

    run_inline = True

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.saver: FencedFloorSaver | None = None

    def on_chain_end(self, outputs: Any, *, parent_run_id: Any = None, **kw: Any) -> None:
        if parent_run_id is None and self.saver is not None:
            self.saver.ended(self.thread_id)

    def on_chain_error(self, error: BaseException, *, parent_run_id: Any = None, **kw: Any) -> None:
        self.on_chain_end(None, parent_run_id=parent_run_id)


def fenced_config(thread_id: str, run_id: str) -> RunnableConfig:
    """A graph run's config for FencedFloorSaver: thread, run id, and the root-only
    callback that releases the run's lease when its call returns."""
    manager = CallbackManager(handlers=[_RunEnd(thread_id)], inheritable_handlers=[])
    return {
        "configurable": {"thread_id": thread_id, "run_id": run_id},
        "metadata": {"run_id": run_id},
        "callbacks": manager,
    }


class FencedFloorSaver(FloorSaver):
    """FloorSaver plus the commit-time guarantees of the retry contract, as cheaply as
    they go: still one round trip and one commit per superstep.

    Kept: a graph run is admitted in its head read (the thread's lease taken, its ledger
    row written, the previous holder's row closed; a live lease of another run refuses
    it, ThreadBusyError, nothing written); every checkpoint write locks and renews the
    lease and is refused (LG413) once another run holds it, ordered against a takeover by
    the row lock; every checkpoint claims its parent's one child slot (lgd_chain: a
    zombie or a race loser cannot fork the thread, LG409); writes stored without their
    child are fenced (LG410) and lease-checked; writes that ride with the child commit
    with its claim or not at all; checkpoint ids move forward (LG411, checked on the
    parameters). The lease is released lazily: by the next statement this saver sends.
    Not kept: the run-id policy and input fingerprint, deliberate branches (lineage
    slots), a Command applied once (LG412), strategies other than reject, the heartbeat
    of long nodes, a finished run's result handed back to its retry, and a timer that
    sends a release when no statement follows (an idle process's lease expires)."""

    def __init__(self, conn: Any, *, one_statement: bool = False, ttl: float = 30.0) -> None:
        super().__init__(conn, one_statement=one_statement)
        self.ttl = ttl
        self._runs: dict[str, tuple[str, str]] = {}  # thread -> (run id, attempt) admitted
        self._to_release: dict[str, str] = {}  # thread -> attempt whose call returned

    def ended(self, thread_id: str) -> None:
        with self._lock:
            held = self._runs.pop(thread_id, None)
            if held is not None:
                self._to_release[thread_id] = held[1]

    def _releases(self, skip: str) -> list[Statement]:
        """The pending releases (all but ``skip``'s thread), taken: [] or one statement."""
        with self._lock:
            taken = [{"thread_id": t, "attempt": a}
                     for t, a in self._to_release.items() if t != skip]  # fmt: skip
            for row in taken:
                del self._to_release[row["thread_id"]]
        return [(RELEASE, taken)] if taken else []

    def _unrelease(self, rows: Sequence[dict[str, Any]]) -> None:
        """A statement failed: its releases go with the next one."""
        with self._lock:
            for row in rows:
                self._to_release.setdefault(row["thread_id"], row["attempt"])

    def _guard(self, sql: str, thread_id: str, ns: str, slot: str, **more: Any) -> Statement:
        run_id, attempt = self._runs.get(thread_id, (None, None))
        params = {"thread_id": thread_id, "ns": ns, "slot": slot, "run_id": run_id,
                  "attempt": attempt, **more}  # fmt: skip
        return sql, [params]

    def _put_statements(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[list[Statement], RunnableConfig]:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        parent = conf.get("checkpoint_id") or ""
        if parent and checkpoint["id"] <= parent:
            raise ValueError(f"LG411: checkpoint {checkpoint['id']} sorts before {parent}")
        statements, next_config = super()._put_statements(
            config, checkpoint, metadata, new_versions
        )
        guard = self._guard(GUARD_PUT, thread_id, ns, parent, checkpoint_id=checkpoint["id"])
        released = self._releases(thread_id)
        if self.one_statement:  # the guard's CTEs in floor_1stmt's statement
            ((_, [one]),) = statements
            return [*released, (PUT_ONE_FENCED, [{**one, **guard[1][0]}])], next_config
        return [*released, guard, *statements], next_config

    def _write_statements(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> list[Statement]:
        statements = super()._write_statements(config, writes, task_id, path)
        if not statements:
            return []
        conf = config["configurable"]
        guard = self._guard(GUARD_WRITES, conf["thread_id"], conf["checkpoint_ns"],
                            conf["checkpoint_id"])  # fmt: skip
        return [*self._releases(conf["thread_id"]), guard, *statements]

    def _leftovers(self, thread_id: str) -> list[Statement]:
        statements = super()._leftovers(thread_id)
        out: list[Statement] = []
        for sql, rows in statements:  # rows of one statement may span checkpoints
            for row in rows:
                out.append(self._guard(GUARD_WRITES, row[0], row[1], row[2]))
                out.append((sql, [row]))
        return out

    def _admission(self, config: RunnableConfig) -> dict[str, Any] | None:
        """The parameters of a graph run's admitting read, or None for any other read."""
        conf = config["configurable"]
        if CONFIG_KEY_RUNTIME not in conf or conf.get("checkpoint_ns") or get_checkpoint_id(
            config
        ):
            return None
        thread_id = conf["thread_id"]
        run_id = str((config.get("metadata") or {}).get("run_id") or conf.get("run_id"))
        attempt = str(uuid.uuid4())
        callbacks = config.get("callbacks")
        handlers: Any = getattr(callbacks, "handlers", None) or callbacks or ()
        for handler in handlers:
            if isinstance(handler, _RunEnd):
                handler.saver = self
        with self._lock:
            freed = self._to_release.pop(thread_id, None)
            self._runs[thread_id] = (run_id, attempt)
        return {"thread_id": thread_id, "ns": "", "run_id": run_id, "attempt": attempt,
                "ttl": self.ttl, "freed": freed}  # fmt: skip

    def _admitted(self, params: dict[str, Any], row: dict[str, Any] | None) -> None:
        if row is None or not row["admitted"]:
            with self._lock:
                self._runs.pop(params["thread_id"], None)
            raise ThreadBusyError(
                f"thread {params['thread_id']!r} is leased by another run (floor_fenced)"
            )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if (params := self._admission(config)) is None:
            return super().get_tuple(config)
        self._store(self._leftovers(params["thread_id"]))
        released = self._releases(params["thread_id"])
        try:
            with self._connection() as conn, conn.cursor(
                binary=True, row_factory=dict_row
            ) as cur:
                if released:  # in the read's round trip and transaction
                    with conn.pipeline():
                        cur.executemany(RELEASE, released[0][1])
                        cur.execute(ADMIT_READ, params)
                else:
                    cur.execute(ADMIT_READ, params)
                row = cur.fetchone()
        except BaseException:
            self._requeue(released)
            raise
        self._admitted(params, row)
        return self._tuple(config, row if row and row["checkpoint_id"] else None)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if (params := self._admission(config)) is None:
            return await super().aget_tuple(config)
        await self._astore(self._leftovers(params["thread_id"]))
        released = self._releases(params["thread_id"])
        try:
            async with (
                self._aconnection() as conn,
                conn.cursor(binary=True, row_factory=dict_row) as cur,
            ):
                if released:  # in the read's round trip and transaction
                    async with conn.pipeline():
                        await cur.executemany(RELEASE, released[0][1])
                        await cur.execute(ADMIT_READ, params)
                else:
                    await cur.execute(ADMIT_READ, params)
                row = await cur.fetchone()
        except BaseException:
            self._requeue(released)
            raise
        self._admitted(params, row)
        return self._tuple(config, row if row and row["checkpoint_id"] else None)

    def _store(self, statements: list[Statement]) -> None:
        try:
            super()._store(statements)
        except BaseException:
            self._requeue(statements)
            raise

    async def _astore(self, statements: list[Statement]) -> None:
        try:
            await super()._astore(statements)
        except BaseException:
            self._requeue(statements)
            raise

    def _requeue(self, statements: list[Statement]) -> None:
        for sql, rows in statements:
            if sql == RELEASE:
                self._unrelease(rows)


# --- the benchmark ----------------------------------------------------------------------

FLOOR_SIDES: dict[str, dict[str, bool]] = {
    "serialise": {"io": False},
    "floor": {},
    "floor_1stmt": {"one_statement": True},
    "floor_nosync": {"durable": False},
}
FENCED_SIDES: dict[str, dict[str, bool]] = {
    "floor_fenced": {},
    "floor_fenced_1stmt": {"one_statement": True},
}
SIDES = ("memory", "serialise", "floor", "floor_1stmt", "floor_nosync", "floor_fenced",
         "floor_fenced_1stmt", "ours", "peer")  # fmt: skip
FLOORS = ("floor", "floor_1stmt")  # the floor is the better of the two
FENCED = tuple(FENCED_SIDES)  # the contract's floor: the better of these two
# graph_sync, graph_async (one at a time) and graph_async_c32 (32 at once, one saver)
WORKLOADS = [w for w in g.WORKLOADS if w.concurrency in (1, 32)]
WORKLOAD_NAMES = [w.name for w in WORKLOADS]
C32_SIDES = ("memory", "floor", "floor_fenced", "ours", "peer")  # fewer: samples are long
NETS = g.NETS
for _side in FENCED:
    b.CONFIGS[_side] = fenced_config
# (numerator, denominator, what it shows)
RATIOS = [
    ("floor", "memory", "best any Postgres saver reaches vs InMemorySaver (target >= 0.5x)"),
    ("floor_1stmt", "memory", "same, the superstep as one statement (arrays)"),
    ("floor_nosync", "memory", "same without waiting for the WAL flush (not durable)"),
    ("floor", "peer", "best ratio reachable vs the peer (targets 1.25x direct, 2x at 1ms)"),
    ("floor_fenced", "peer", "same, keeping the contract's commit-time guarantees"),
    ("floor_fenced_1stmt", "peer", "same, the fenced superstep as one statement"),
    ("floor_fenced", "memory", "the contract's floor vs InMemorySaver (target >= 0.5x)"),
    ("floor_fenced", "floor", "what the contract's guarantees cost at the floor"),
    ("ours", "floor_fenced", "ours vs the contract's floor (our real headroom)"),
    ("ours", "floor", "ours vs the floor (1.00x = at the floor)"),
    ("ours", "peer", "ours vs the peer (as bench_graph.py)"),
    ("serialise", "memory", "serialisation only vs InMemorySaver"),
]


@dataclass
class Cell:
    workload: Any  # bench_graph.Workload
    net: str
    sides: tuple[str, ...] = SIDES
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.samples = {s: [] for s in self.sides}

    def has(self, *sides: str) -> bool:
        return all(s in self.samples for s in sides)

    def ratios(self, num: str, den: str) -> list[float]:
        return [
            a.ops_per_s / z.ops_per_s
            for a, z in zip(self.samples[num], self.samples[den], strict=True)
        ]

    def rps(self, side: str) -> float:
        return float(statistics.median(s.ops_per_s for s in self.samples[side]))

    def p50_ms(self, side: str) -> float:
        return float(percentile([x for s in self.samples[side] for x in s.latencies], 50) * 1e3)

    def cpu_ms(self, side: str) -> tuple[float, float]:
        """(client, server) CPU ms per run, medians over rounds."""
        s = self.samples[side]
        cli = statistics.median(x.client_cpu_s * 1e3 / x.ops for x in s)
        srv = statistics.median((x.server_cpu_s or 0.0) * 1e3 / x.ops for x in s)
        return cli, srv

    def proxy_ms(self, side: str) -> float | None:
        """The delay proxy's CPU ms per run (median over rounds); None when direct."""
        px = [x.proxy_cpu_s * 1e3 / x.ops for x in self.samples[side] if x.proxy_cpu_s is not None]
        return statistics.median(px) if px else None


POSTGRES_SIDES = ("floor", "floor_1stmt", "floor_nosync", *FENCED, "ours", "peer")


def floor_saver(side: str, conn: Any) -> FloorSaver | None:
    """The FloorSaver of a floor side over ``conn``; None for other sides."""
    if side in FLOOR_SIDES:
        return FloorSaver(conn, **FLOOR_SIDES[side])
    if side in FENCED_SIDES:
        return FencedFloorSaver(conn, **FENCED_SIDES[side])
    return None


def add_floor_graphs(net: Any) -> None:
    """FloorSaver sides on the network's shared pools (the peer's)."""
    pool, apool = net.pools[0], net.pools[1]
    for side, kwargs in FLOOR_SIDES.items():
        for sync in (True, False):
            saver = FloorSaver(pool if sync else apool, **kwargs)
            net.graphs[side, sync] = b.build_graph(not sync).compile(checkpointer=saver)
    for side, kwargs in FENCED_SIDES.items():
        for sync in (True, False):
            saver = FencedFloorSaver(pool if sync else apool, **kwargs)
            net.graphs[side, sync] = b.build_graph(not sync).compile(checkpointer=saver)


def check_floor(dsn: str) -> list[str]:
    """Before measuring: the floor stores what the peer stores and reads back (the peer's
    layout), its commit really skips the flush wait when asked, and its get_tuple reads a
    thread back. Returns lines for the header; raises if anything is off."""
    notes = []
    with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
        counts = {}
        for side in ("floor", "floor_1stmt", *FENCED, "peer"):
            saver: Any = floor_saver(side, conn) or PostgresSaver(conn)
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
            for reader in (PostgresSaver(conn), FloorSaver(conn)):
                head = reader.get_tuple({"configurable": {"thread_id": thread_id}})
                assert head is not None, (side, reader)
                got = len(head.checkpoint["channel_values"]["messages"])
                assert got == b.EXPECTED_MESSAGES, (side, type(reader).__name__, got)
            if side == "floor":  # a second run on the thread resumes from the floor's head
                again = {**config, "metadata": {"run_id": "second"}}
                again["configurable"] = {**config["configurable"], "run_id": "second"}
                more = graph.invoke(b.graph_input(), again, durability="sync")
                assert len(more["messages"]) == 2 * b.EXPECTED_MESSAGES, len(more["messages"])
        if len(set(counts.values())) != 1:
            raise AssertionError(f"a floor stores other rows than the peer: {counts}")
        notes.append(
            "rows per run (checkpoints, blobs, writes): "
            + " = ".join(f"{side} {n}" for side, n in counts.items())
            + "; each reads the other's threads"
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


def check_fenced(dsn: str) -> list[str]:
    """Before measuring: floor_fenced keeps what it claims. On one thread, through the
    saver's own calls (a graph run's admitting read, puts) with three savers standing for
    three workers: a retry (same run, a new attempt) takes the lease over and continues;
    the old attempt, now a zombie, cannot fork the thread (LG409) and its write leaves
    nothing; another run is refused while the lease is live (nothing written); a finished
    run's lease is released by the saver's next statement; a run admitted after it and
    the old run's late write is refused (LG413). Plus a graph run's rows: one chain slot
    per checkpoint, one ledger row, the lease released by the next run's read."""
    from langgraph.checkpoint.base import empty_checkpoint

    def admit(saver: FencedFloorSaver, thread: str, run: str) -> None:
        saver.get_tuple({"configurable": {"thread_id": thread, CONFIG_KEY_RUNTIME: True},
                         "metadata": {"run_id": run}})  # fmt: skip

    def put(saver: FencedFloorSaver, thread: str, parent: str | None, cid: str) -> None:
        ckpt = empty_checkpoint()
        ckpt["id"] = cid
        conf = {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": parent}
        saver.put({"configurable": conf}, ckpt, {"source": "loop", "step": 0}, {})

    def refused(code: str, call: Any) -> bool:
        quiet = logging.getLogger("psycopg")  # its note on the aborted pipeline: expected
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            call()
        except psycopg.Error as exc:
            return exc.sqlstate == code
        except ThreadBusyError:
            return code == "busy"
        finally:
            quiet.setLevel(level)
        return False

    thread = f"fenced-check-{uuid.uuid4()}"
    with (
        psycopg.connect(dsn, **g.POOL_KWARGS) as c1,
        psycopg.connect(dsn, **g.POOL_KWARGS) as c2,
        psycopg.connect(dsn, **g.POOL_KWARGS) as c3,
    ):
        w1, w2, w3 = FencedFloorSaver(c1), FencedFloorSaver(c2), FencedFloorSaver(c3)

        def n(sql: str) -> int:
            row = c3.execute(sql, (thread,)).fetchone()
            assert row is not None
            return int(next(iter(row.values())))

        admit(w1, thread, "r1")
        put(w1, thread, None, "0001")
        admit(w2, thread, "r1")  # the orchestrator's retry of r1: a new attempt
        put(w2, thread, "0001", "0002")
        assert refused("LG409", partial(put, w1, thread, "0001", "0003")), "zombie forked"
        assert n("SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_id = '0003'") == 0
        assert refused("busy", partial(admit, w3, thread, "r2")), "admitted beside a live lease"
        assert n("SELECT count(*) FROM lgd_runs WHERE thread_id = %s AND run_id = 'r2'") == 0
        # r1's worker stalls past its lease (expired here by hand), r2 takes the thread
        c3.execute("UPDATE lgd_leases SET expires_at = now() - interval '1 second' "
                   "WHERE thread_id = %s", (thread,))  # fmt: skip
        admit(w3, thread, "r2")
        assert refused("LG413", partial(put, w2, thread, "0002", "0004")), "late write kept"
        assert n("SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_id = '0004'") == 0
        assert n("SELECT attempts FROM lgd_runs WHERE thread_id = %s AND run_id = 'r1'") == 2
        put(w3, thread, "0002", "0005")
        w3.ended(thread)  # r2's call returned: released by w3's next statement
        admit(w3, f"{thread}-other", "r9")
        assert n("SELECT count(*) FROM lgd_leases WHERE thread_id = %s AND ended = 'ok'") == 1
        admit(w1, thread, "r3")  # the next run closes r2's ledger row
        assert n("SELECT count(*) FROM lgd_runs WHERE thread_id = %s AND status = 'done'") == 1

        graph = b.build_graph(False).compile(checkpointer=FencedFloorSaver(c1))
        config = fenced_config(f"fenced-check-{uuid.uuid4()}", "g1")
        graph.invoke(b.graph_input(), config, durability="sync")
        graph.invoke(b.graph_input(), fenced_config(f"fenced-check-{uuid.uuid4()}", "g2"),
                     durability="sync")  # fmt: skip
        thread = config["configurable"]["thread_id"]
        rows = [n(f"SELECT count(*) FROM {t} WHERE thread_id = %s")
                for t in ("lgd_chain", "lgd_runs", "checkpoints")]  # fmt: skip
        ended = n("SELECT count(*) FROM lgd_leases WHERE thread_id = %s AND ended = 'ok'")
        assert rows[0] == rows[2] and rows[1] == 1 and ended == 1, (rows, ended)
    return [
        "floor_fenced keeps its guarantees (checked): a retry takes the lease over, the "
        "zombie's fork is refused (LG409), another run is refused while the lease is live, "
        "a stalled run's write after a takeover is refused (LG413); per graph run "
        f"{rows[0]} chain slots for {rows[2]} checkpoints, 1 ledger row, the lease released "
        "by the next statement"
    ]


def traced_round_trips(dsn: str, policy: str) -> dict[str, dict[str, float]]:
    """Exact protocol counts of one sync graph run per Postgres side on one connection."""
    out = {}
    for side in POSTGRES_SIDES:
        with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
            if (saver := floor_saver(side, conn)) is not None:
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
    for side in POSTGRES_SIDES:
        with psycopg.connect(dsn, **g.POOL_KWARGS) as conn:
            if (saver := floor_saver(side, conn)) is not None:
                graph = b.build_graph(False).compile(checkpointer=saver)
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


def n_ops(w: Any, args: argparse.Namespace) -> int:
    if w.concurrency == 1:
        return 1 if args.quick else args.runs
    return int(w.concurrency * (1 if args.quick else max(1, args.c32_runs // w.concurrency)))


async def run_rounds(args: argparse.Namespace, nets: dict[str, Any]) -> list[Cell]:
    workloads = [w for w in WORKLOADS if w.name in args.workloads]
    cells = [
        Cell(w, n, C32_SIDES if w.concurrency > 1 else SIDES) for w in workloads for n in args.nets
    ]
    if not args.quick:
        for c in cells:
            for side in c.sides:
                await g.run_sample(c.workload, nets[c.net], side, 2 * c.workload.concurrency)
    for r in range(args.rounds):
        started = time.perf_counter()
        for c in cells:
            k = r % len(c.sides)
            for side in c.sides[k:] + c.sides[:k]:
                gc.collect()
                c.samples[side].append(
                    await g.run_sample(c.workload, nets[c.net], side, n_ops(c.workload, args))
                )
        print(f"  round {r + 1}/{args.rounds} done in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return cells


def format_sides(cells: Sequence[Cell]) -> str:
    head = (
        f"{'workload':<15} {'net':<6} {'side':<18} {'runs/s':>7} {'p50 ms':>7} "
        f"{'cli ms':>7} {'srv ms':>7} {'cli+srv':>8} {'proxy ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for c in cells:
        for side in c.sides:
            cli, srv = c.cpu_ms(side)
            px = c.proxy_ms(side)
            lines.append(
                f"{c.workload.name:<15} {c.net:<6} {side:<18} {c.rps(side):>7.1f} "
                f"{c.p50_ms(side):>7.2f} {cli:>7.2f} {srv:>7.2f} {cli + srv:>8.2f} "
                f"{'-' if px is None else f'{px:.2f}':>8}"
            )
    return "\n".join(lines)


def format_ratios(cells: Sequence[Cell]) -> str:
    head = f"{'ratio':<26} " + " ".join(f"{f'{c.workload.name} {c.net}':>24}" for c in cells)
    lines = [head, "-" * len(head)]
    for num, den, what in RATIOS:
        row = []
        for c in cells:
            if not c.has(num, den):
                row.append("-")
                continue
            rr = c.ratios(num, den)
            row.append(f"{statistics.median(rr):.2f}x ({min(rr):.2f}-{max(rr):.2f})")
        lines.append(f"{f'{num}/{den}':<26} " + " ".join(f"{x:>24}" for x in row) + f"  {what}")
    return "\n".join(lines)


def best(c: Cell, sides: Sequence[str], other: str) -> tuple[str, float]:
    """The side of ``sides`` with the best median paired ratio against ``other``."""
    return max(((s, statistics.median(c.ratios(s, other))) for s in sides if c.has(s)),
               key=lambda x: x[1])  # fmt: skip


def verdicts(cells: Sequence[Cell]) -> list[str]:
    """Each target of issue 13 against the floor and against the contract's floor:
    reachable by any Postgres saver / by any saver keeping the contract, or not."""
    out = []
    targets = {("direct", "memory"): 0.5, ("direct", "peer"): 1.25, ("1ms", "peer"): 2.0}
    for c in (c for c in cells if c.workload.concurrency == 1):
        for (net, other), target in targets.items():
            if c.net != net:
                continue
            _, floor = best(c, FLOORS, other)
            fs, fenced = best(c, FENCED, other)
            ours = statistics.median(c.ratios("ours", other))
            state = "reachable" if floor >= target else "OUT OF REACH (the floor is below it)"
            fstate = (
                "reachable keeping the contract"
                if fenced >= target
                else "OUT OF REACH keeping the contract (the contract's floor is below it)"
            )
            out.append(
                f"  {c.workload.name} {net}: vs {other} >= {target}x: floor {floor:.2f}x -> "
                f"{state}; contract's floor ({fs}) {fenced:.2f}x -> {fstate}; ours "
                f"{ours:.2f}x = {ours / floor:.0%} of the floor's ratio, "
                f"{ours / fenced:.0%} of the contract's floor's"
            )
        if c.net == "direct":
            fc, pc, oc = (sum(c.cpu_ms(s)) for s in ("floor", "peer", "ours"))
            fsc = min(sum(c.cpu_ms(s)) for s in FENCED)
            state = "reachable" if fc / pc <= 0.8 else "OUT OF REACH (the floor is above it)"
            fstate = "reachable" if fsc / pc <= 0.8 else "OUT OF REACH"
            out.append(
                f"  {c.workload.name} direct: CPU (cli+srv) <= 0.8x the peer's: floor "
                f"{fc:.1f} / peer {pc:.1f} ms = {fc / pc:.2f}x -> {state}; contract's floor "
                f"{fsc:.1f} ms = {fsc / pc:.2f}x -> {fstate} keeping the contract; ours "
                f"{oc:.1f} ms = {oc / pc:.2f}x"
            )
    for c in (c for c in cells if c.workload.concurrency > 1):
        goal = 5.0 if c.net == "1ms" else None
        fl = statistics.median(c.ratios("floor", "peer"))
        fe = statistics.median(c.ratios("floor_fenced", "peer"))
        ours = statistics.median(c.ratios("ours", "peer"))
        head = f"  {c.workload.name} {c.net}: vs peer"
        if goal is None:
            out.append(f"{head} (no target): floor {fl:.2f}x, floor_fenced {fe:.2f}x, ours {ours:.2f}x")
            continue
        need = goal * c.rps("peer")
        cap = {s: capacity(c, s) for s in ("floor", "floor_fenced", "ours")}
        state = (
            "reachable (measured)"
            if max(fl, fe) >= goal
            else "reachable on this machine by the CPU bound"
            if cap["floor_fenced"]["no_proxy"] >= need
            else "OUT OF REACH on 2 cores (the floor's CPU bound is below it)"
        )
        # One asyncio process keeps its core at most as busy as InMemorySaver's run does.
        busy = min(1.0, c.rps("memory") * c.cpu_ms("memory")[0] / 1e3)
        cores = os.cpu_count() or 1
        out.append(
            f"{head} >= {goal}x needs {need:.0f} runs/s: client CPU <= {busy * 1e3 / need:.1f} "
            f"ms/run (one core, {busy:.0%} busy as memory's) and client + server + proxy <= "
            f"{cores * 1e3 / need:.1f} ms/run ({cores} cores); "
            + ", ".join(
                f"{s} {c.cpu_ms(s)[0]:.1f} / {sum(c.cpu_ms(s)) + (c.proxy_ms(s) or 0.0):.1f}"
                for s in ("floor", "floor_fenced", "ours")
            )
        )
        out.append(
            f"{head} >= {goal}x ({need:.0f} runs/s, peer {c.rps('peer'):.1f}): floor {fl:.2f}x, "
            f"floor_fenced {fe:.2f}x, ours {ours:.2f}x -> {state}; CPU bounds without the proxy: "
            + ", ".join(
                f"{s} {v['no_proxy']:.0f} runs/s ({v['no_proxy'] / c.rps('peer'):.1f}x)"
                for s, v in cap.items()
            )
        )
    return out


def capacity(c: Cell, side: str) -> dict[str, float]:
    """Runs/s the side's CPU per run allows: one asyncio client process uses at most one
    core (``client``); client + server + proxy share the machine's cores (``machine``);
    ``no_proxy``: the same without the proxy's CPU (a real network's), and the client
    bound."""
    cores = os.cpu_count() or 1
    cli, srv = c.cpu_ms(side)
    px = c.proxy_ms(side) or 0.0
    client = 1e3 / cli
    machine = cores * 1e3 / (cli + srv + px)
    no_proxy = min(client, cores * 1e3 / (cli + srv))
    return {"client": client, "machine": machine, "no_proxy": no_proxy, "bound": min(client, machine)}


def concurrency_breakdown(cells: Sequence[Cell]) -> list[str]:
    """What bounds runs/s at concurrency 32 on this machine, per side: CPU per run of the
    client process, the server backends and the delay proxy, and the runs/s each allows."""
    out = []
    cores = os.cpu_count() or 1
    for c in (c for c in cells if c.workload.concurrency > 1):
        for side in c.sides:
            cli, srv = c.cpu_ms(side)
            px = c.proxy_ms(side)
            rps = c.rps(side)
            if side == "memory":
                out.append(f"  {c.workload.name} {c.net} {side:<13} {rps:6.1f} runs/s: client "
                           f"{cli:.2f} ms/run ({rps * cli / 1e3:.0%} of a core)")  # fmt: skip
                continue
            cap = capacity(c, side)
            used = rps * (cli + srv + (px or 0.0)) / 1e3
            bound = "the client's core" if cap["client"] <= cap["machine"] else f"{cores} cores"
            out.append(
                f"  {c.workload.name} {c.net} {side:<13} {rps:6.1f} runs/s: client {cli:.2f} + "
                f"server {srv:.2f}" + (f" + proxy {px:.2f}" if px is not None else "")
                + f" ms/run; bounds: one core for the client {cap['client']:.0f}, {cores} cores "
                f"{cap['machine']:.0f} runs/s -> {bound} binds at {cap['bound']:.0f}; measured "
                f"{rps / cap['bound']:.0%} of it (client core {rps * cli / 1e3:.0%} busy, "
                f"machine {used / cores:.0%}); without the proxy {cap['no_proxy']:.0f} runs/s"
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
    by = {(c.workload.name, c.net): c for c in cells if c.workload.concurrency == 1}
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
        if c.net != "direct" or c.workload.concurrency != 1:
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
    parser.add_argument(
        "--workloads", default=",".join(WORKLOAD_NAMES), help=f"subset of {WORKLOAD_NAMES}"
    )
    parser.add_argument("--c32-runs", type=int, default=64, help="graph runs per C=32 sample")
    parser.add_argument("--proxy-engine", choices=delay_proxy.ENGINES, default="relay")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="proxy delay per round trip")
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--wal-runs", type=int, default=None, help="default 10; 2 with --quick")
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    args.nets = [n for n in args.nets.split(",") if n]
    if not args.nets or set(args.nets) - set(NETS):
        parser.error(f"--nets takes a subset of {list(NETS)}")
    args.workloads = [w for w in args.workloads.split(",") if w]
    if not args.workloads or set(args.workloads) - set(WORKLOAD_NAMES):
        parser.error(f"--workloads takes a subset of {WORKLOAD_NAMES}")
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
    proxy: delay_proxy.Proxy | None = None
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
            proxy = delay_proxy.start_proxy(
                unix=unix, host=host, port=port, rtt_ms=args.rtt_ms, engine=args.proxy_engine
            )
            dsns["1ms"] = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
        rtt = {n: g.measured_rtt_ms(dsns[n]) for n in args.nets}
        refused = g.ours_takes_langgraph_settings(dsn, policy)
        if refused is not None:
            raise SystemExit(f"DeterministicSaver fails on LangGraph's pool settings: {refused}")
        notes = check_floor(dsn) + check_fenced(dsn)
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
                n: await g.open_net(
                    n, dsns[n], args.pool_size, policy, True, proxy if n == "1ms" else None
                )
                for n in args.nets
            }
            try:
                for net in nets.values():
                    add_floor_graphs(net)
                cells = await run_rounds(args, nets)
                for (side, _), graph in (kv for net in nets.values() for kv in net.graphs.items()):
                    if side in FLOORS + FENCED:
                        alone[side] = alone.get(side, 0) + graph.checkpointer.stored_alone
                return cells
            finally:
                for net in nets.values():
                    await g.close_net(net)

        cells = asyncio.run(go())
        load_after = os.getloadavg()
        print(
            "\nper side: runs/s median over rounds; p50 of one run; CPU per run (medians): "
            "cli = this process, srv = the pool's Postgres backends, proxy = the delay proxy's "
            "process (1ms: it shares the cores; a real network costs the app host no such CPU)"
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
        if any(c.workload.concurrency > 1 for c in cells):
            print(f"\nwhat bounds concurrency 32 on {os.cpu_count()} cores (one shared saver, "
                  f"pool of {args.pool_size}; CPU per run, medians):")  # fmt: skip
            print("\n".join(concurrency_breakdown(cells)))
        print("\nissue 13's targets against the floor and the contract's floor:")
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
                    "runs_per_s": {s: c.rps(s) for s in c.sides},
                    "p50_ms": {s: c.p50_ms(s) for s in c.sides},
                    "cpu_ms": {s: c.cpu_ms(s) for s in c.sides},
                    "proxy_cpu_ms": {s: c.proxy_ms(s) for s in c.sides},
                    "ratios": {f"{n}/{d}": c.ratios(n, d) for n, d, _ in RATIOS
                               if c.has(n, d)},
                    "rounds": len(c.samples["floor"]),
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
