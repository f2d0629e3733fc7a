"""DeterministicSaver: one class, sync and async, over the sans-I/O core in ``_core``.

The drivers (``_drivers``) only execute :class:`~._batch.Batch` objects on a connection. A pool
gives every concurrent call its own connection, with no saver-wide lock (the peer takes
one lock per saver, which serialises all async work even with a pool); a single
connection is shared under a lock, since one connection runs one transaction at a time.

This module holds the public API and runs operations (``_run`` / ``_arun``); its parts
live beside it: the connections and pools (``_connections``), entering and closing
(``_lifecycle``), crossing between threads and event loops (``_bridge``) and the hooks of
PostgresJournal (``_events``).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol, maybe_add_typed_methods
from psycopg import AsyncConnection, Connection
from psycopg_pool import PoolTimeout

from langgraph_deterministic._compat.langgraph import NULL_TASK_ID
from langgraph_deterministic._compat.psycopg_pool import count_usage
from langgraph_deterministic._db import migrate as _migrate
from langgraph_deterministic._db.batch import (
    Batch,
    Operation,
    Results,
    Statement,
    arun,
    run,
    store,
    writes_first,
)
from langgraph_deterministic._db.drivers import aexecute, execute
from langgraph_deterministic._serde import AllowedType, SafeSerializer
from langgraph_deterministic.checkpointer import _core, _reads
from langgraph_deterministic.checkpointer._bridge import (
    AwaitableList,
    SyncCallOnLoopError,
    run_on_loop,
    running_loop,
    sync_on_loop_error,
    wait_from_thread,
    wait_shielded,
)
from langgraph_deterministic.checkpointer._connections import (
    _TRANSLATED,
    _UNSET,
    Connections,
    ConnectionSource,
    _require_autocommit,
    _Unset,
    _wait_unlocked,
    apool_timeout_error,
    pool_timeout_error,
)
from langgraph_deterministic.checkpointer._events import (
    CHECKPOINT_EVENTS,
    JOURNAL_ADMISSION,
    _admitted,
    _announce,
    _found_id,
    _held,
)
from langgraph_deterministic.checkpointer._leases import LeaseKeeper
from langgraph_deterministic.checkpointer._lifecycle import Lifecycle
from langgraph_deterministic.checkpointer._rows import Codec, next_version
from langgraph_deterministic.checkpointer._waiting import (
    ACheckout,
    Checkout,
    QueueListener,
    listener_for,
)
from langgraph_deterministic.checkpointer._writebuffer import Waiter, WriteBuffer, store_leftovers
from langgraph_deterministic.checkpointer.contract import (
    DEFAULT_METADATA_KEYS,
    HeldLease,
    MultitaskStrategy,
    RunContract,
    RunRecord,
    check_strategy,
    find_recorder,
)
from langgraph_deterministic.errors import ConfigurationError

if TYPE_CHECKING:
    from langgraph_deterministic.retention import RetentionPolicy, SweepReport

logger = logging.getLogger("langgraph_deterministic")

T = TypeVar("T")
RunIdPolicy = Literal["require", "warn", "off"]

# An operation that needs the session's client-side backend pid (see _setup).
OnSession = Callable[[int], Operation[T]]


# --- the saver ----------------------------------------------------------------------


class DeterministicSaver(Lifecycle, Connections, BaseCheckpointSaver[str]):
    """A Postgres checkpointer for LangGraph, with the sync and the async API.

    Table-compatible with ``langgraph-checkpoint-postgres``: it reads and writes the same
    tables, so threads either saver wrote are continued by the other. Adopting it is a
    one-class swap plus a run id on every graph call (``run_config(thread_id, run_id)``):
    under the default ``run_id_policy="require"`` a call without one raises
    :class:`~langgraph_deterministic.RunIdRequiredError`; ``"warn"`` accepts it (and logs
    once per thread) while callers are migrated.

    ``conn`` is one of:

    * a DSN string: the saver owns a connection pool per API it is used with. Use it as a
      context manager (``with`` / ``async with``) or call ``close()`` / ``aclose()``.
      ``pool_min_size``, ``pool_max_size``, ``prepare_threshold`` (``None`` behind
      PgBouncer in transaction mode) and ``connect_kwargs`` (any psycopg connection
      keyword) configure those pools;
    * a ``psycopg_pool.ConnectionPool`` or ``AsyncConnectionPool`` created with
      ``kwargs={"autocommit": True, ...}``: concurrent calls run on separate connections,
      in parallel;
    * a ``psycopg.Connection`` or ``AsyncConnection`` with ``autocommit=True``: calls
      share it one at a time.

    Any ``row_factory`` works (the saver reads its rows with its own). Call ``setup()`` /
    ``asetup()`` once per database to create or upgrade the tables.

    ``multitask_strategy`` decides what a graph run does when another run holds its
    thread, or the previous run stopped unfinished: ``"reject"`` (``ThreadBusyError`` /
    ``RunUnfinishedError``), ``"enqueue"`` (wait its turn, FIFO, up to
    ``enqueue_timeout`` seconds), ``"interrupt"`` or ``"rollback"``; ``run_config(...,
    multitask_strategy=...)`` overrides it per call. A graph run holds its thread's lease
    while it runs; ``lease_ttl`` (seconds) is how long a crashed worker keeps the thread
    busy (the lease is renewed by writes and a heartbeat while the run is alive).

    ``buffer_writes`` (seconds, default 0.05): in a graph run this saver admitted, a
    superstep's pending writes are stored in the transaction of the checkpoint that ends
    it (one commit per superstep, still before the next superstep starts), or on their own
    once they have waited that long, or when the run ends. A worker killed within that
    time of a task's end, before its superstep's checkpoint, loses the task's writes (it
    runs again on the retry). ``0`` commits every ``put_writes`` on its own.

    Stored data never makes the saver import or call a name: the default ``serde`` (a
    :class:`SafeSerializer`) builds LangChain's messages and documents, LangGraph's own
    types, the standard library's value types and the ``allowed_types`` you list (classes,
    or ``(module, name)`` pairs) and raises :class:`~langgraph_deterministic.UnsafeDataError`
    for any other type a row names, and for pickles (see the Security page).
    """

    def __init__(
        self,
        conn: ConnectionSource,
        *,
        run_id_policy: RunIdPolicy = "require",
        serde: SerializerProtocol | None = None,
        metadata_keys: Iterable[str] | None = None,
        pool_min_size: int | None = None,
        pool_max_size: int | None = None,
        prepare_threshold: int | _Unset | None = _UNSET,
        connect_kwargs: Mapping[str, Any] | None = None,
        multitask_strategy: MultitaskStrategy = "reject",
        lease_ttl: float = 30.0,
        enqueue_timeout: float = 300.0,
        buffer_writes: float = 0.05,
        allowed_types: Iterable[AllowedType] = (),
    ) -> None:
        allowed = tuple(allowed_types)
        if serde is not None and allowed:
            raise ConfigurationError(
                "allowed_types extends the default serializer; with your own serde, allow "
                "the types on it instead (SafeSerializer(allowed_types=[...]), or "
                "JsonPlusSerializer(allowed_msgpack_modules=[...]))."
            )
        super().__init__(serde=serde or SafeSerializer(allowed))  # sets self.serde (below)
        self.multitask_strategy: MultitaskStrategy = check_strategy(multitask_strategy)
        if not lease_ttl > 0 or not enqueue_timeout >= 0:
            raise ConfigurationError(
                f"lease_ttl must be > 0 and enqueue_timeout >= 0 seconds, got {lease_ttl!r} "
                f"and {enqueue_timeout!r}."
            )
        self.lease_ttl = float(lease_ttl)
        self.enqueue_timeout = float(enqueue_timeout)
        if run_id_policy not in ("require", "warn", "off"):
            raise ConfigurationError(
                f"run_id_policy must be 'require', 'warn' or 'off', not {run_id_policy!r}."
            )
        self.run_id_policy: RunIdPolicy = run_id_policy
        # Configurable keys copied into stored checkpoint metadata (see contract.py).
        self.metadata_keys = (
            DEFAULT_METADATA_KEYS if metadata_keys is None else frozenset(metadata_keys)
        )
        self._contract: RunContract | None = None
        # A superstep's pending writes ride in its checkpoint's transaction (_writebuffer).
        if not 0 <= buffer_writes <= 60:
            raise ConfigurationError(
                f"buffer_writes must be 0 to 60 seconds (0: a commit per put_writes), got "
                f"{buffer_writes!r}."
            )
        self._writes = (
            WriteBuffer(
                float(buffer_writes),
                lambda statements: self._run(store(statements)),
                lambda statements: self._arun(store(statements)),
            )
            if buffer_writes
            else None
        )
        writes = self._writes
        self._leases = LeaseKeeper(
            self._run,
            self._arun,
            lambda: self.lease_ttl,
            writes.end if writes else _none,
        )
        self._init_connections(
            conn, pool_min_size, pool_max_size, prepare_threshold, connect_kwargs
        )
        self._listener: QueueListener | None = None  # wakes enqueue waiters (_waiting)

    @property
    def serde(self) -> SerializerProtocol:
        """The serializer of channel values and writes. Assigning one after construction
        takes effect at once (LangGraph's own fixtures set an EncryptedSerializer so)."""
        return self._serde

    @serde.setter
    def serde(self, value: SerializerProtocol) -> None:
        self._serde = maybe_add_typed_methods(value)
        self._codec = Codec(self._serde)

    @classmethod
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        pipeline: bool = False,
        run_id_policy: RunIdPolicy = "require",
        serde: SerializerProtocol | None = None,
        metadata_keys: Iterable[str] | None = None,
        pool_min_size: int | None = None,
        pool_max_size: int | None = None,
        prepare_threshold: int | _Unset | None = _UNSET,
        connect_kwargs: Mapping[str, Any] | None = None,
        multitask_strategy: MultitaskStrategy = "reject",
        lease_ttl: float = 30.0,
        enqueue_timeout: float = 300.0,
        buffer_writes: float = 0.05,
        allowed_types: Iterable[AllowedType] = (),
    ) -> DeterministicSaver:
        """The peer's constructor: ``with DeterministicSaver.from_conn_string(dsn) as saver``
        (or ``async with``; one saver serves both APIs). It owns its pools and closes them
        when the block ends. ``pipeline`` is accepted for compatibility: this saver always
        sends a call's statements in one pipeline. The other options are the
        constructor's."""
        del pipeline
        return cls(
            conn_string,
            run_id_policy=run_id_policy,
            serde=serde,
            metadata_keys=metadata_keys,
            pool_min_size=pool_min_size,
            pool_max_size=pool_max_size,
            prepare_threshold=prepare_threshold,
            connect_kwargs=connect_kwargs,
            multitask_strategy=multitask_strategy,
            lease_ttl=lease_ttl,
            enqueue_timeout=enqueue_timeout,
            buffer_writes=buffer_writes,
            allowed_types=allowed_types,
        )

    # -- running operations ----------------------------------------------------------

    # A call on a pool checks a connection out and back in directly: pool.connection()
    # would add two context managers and a commit() per call, a no-op on an autocommit
    # connection (putconn rolls back any transaction left open, as that commit's rollback
    # on error would), and every call of a graph run would pay for them. An enqueue wait
    # gives the connection back meanwhile (_waiting.Checkout). What connection() counts
    # in the pool's get_stats()["usage_ms"] is counted alike (_compat.psycopg_pool).

    def _run(self, operation: Operation[T] | OnSession[T]) -> T:
        pool = self._pool
        if pool is None and self._dsn is not None and not self._closed:
            pool = self._sync_pool()  # its first call: the pool path below
        if pool is not None and not self._closed:
            with _TRANSLATED:
                try:
                    conn = pool.getconn()
                except PoolTimeout as exc:
                    raise pool_timeout_error(pool, exc) from exc
                t0 = time.monotonic()
                # An enqueue wait gives the connection back to the pool (_waiting).
                checkout = Checkout(pool, conn, self._queue_listener(), self._checked, execute)
                try:
                    if self._check_pool:
                        _require_autocommit(conn, pool=True)
                    op = operation(conn.info.backend_pid) if callable(operation) else operation
                    return run(op, checkout.execute)
                finally:
                    checkout.close()
                    count_usage(pool, t0)
        if not self._has_sync():
            return self._run_on_loop(operation)
        with _TRANSLATED, self._connection() as conn:
            op = operation(conn.info.backend_pid) if callable(operation) else operation
            if conn is self._conn:
                return run(op, partial(self._execute_shared, conn))
            return run(op, lambda batch: execute(conn, batch))

    async def _arun(self, operation: Operation[T] | OnSession[T]) -> T:
        if not self._has_async():
            # Sync-only connection: keep the event loop free by running it in a thread.
            return await asyncio.to_thread(self._run, operation)
        self._loop = asyncio.get_running_loop()
        pool = self._apool
        if pool is None and self._dsn is not None and not self._closed:
            pool = await self._async_pool()  # its first call: the pool path below
        if pool is not None and not self._closed:
            with _TRANSLATED:
                try:
                    conn = await pool.getconn()
                except PoolTimeout as exc:
                    raise await apool_timeout_error(pool, exc) from exc
                t0 = time.monotonic()
                acheckout = ACheckout(pool, conn, self._queue_listener(), self._checked, aexecute)
                try:
                    if self._check_pool:
                        _require_autocommit(conn, pool=True)
                    op = operation(conn.info.backend_pid) if callable(operation) else operation
                    return await arun(op, acheckout.execute)
                finally:
                    await acheckout.close()
                    count_usage(pool, t0)
        with _TRANSLATED:
            async with self._aconnection() as conn:
                op = operation(conn.info.backend_pid) if callable(operation) else operation
                if conn is self._aconn:
                    return await arun(op, partial(self._aexecute_shared, conn))
                return await arun(op, lambda batch: aexecute(conn, batch))

    # The database layer's entry for the runner: PostgresJournal's statements run on the
    # saver's connections as the saver's own do (same pool, same error translation).

    def run_operation(self, operation: Operation[T]) -> T:
        """Run a sans-I/O operation (a generator of ``_db.batch.Batch`` objects) on one of
        this saver's connections. Internal, for ``PostgresJournal``: not part of the
        checkpointer API, no stability promised."""
        return self._run(operation)

    async def arun_operation(self, operation: Operation[T]) -> T:
        """:meth:`run_operation` on the async connection (a sync one: in a thread)."""
        return await self._arun(operation)

    def _checked(self, conn: Connection[Any] | AsyncConnection[Any]) -> None:
        if self._check_pool:
            _require_autocommit(conn, pool=True)

    def _queue_listener(self) -> QueueListener:
        """The listener that wakes this saver's enqueue waiters, made on first use: it
        connects like the saver's pools, on a connection of its own."""
        listener = self._listener
        if listener is None:
            pool: Any = self._pool or self._apool
            if self._dsn is not None:
                listener = listener_for(self._dsn, self._connect_kwargs)
            elif pool is not None and not callable(pool.kwargs):
                listener = listener_for(pool.conninfo, pool.kwargs)
            else:
                listener = listener_for(None, None)
            self._listener = listener
        return listener

    # One connection for every call: a run queued behind another on its thread (a NOTIFY
    # wait) would keep it from the very run it waits for, so on a shared connection the
    # wait gives the connection up and sleeps instead (the core re-polls its admission).

    def _execute_shared(self, conn: Connection[Any], batch: Batch) -> Results:
        if batch.wait is None:
            return execute(conn, batch)
        self._lock.release()
        try:
            time.sleep(batch.wait[1])
        finally:
            self._lock.acquire()
        return []

    async def _aexecute_shared(self, conn: AsyncConnection[Any], batch: Batch) -> Results:
        if batch.wait is None:
            return await aexecute(conn, batch)
        assert self._alock is not None
        await _wait_unlocked(self._alock, batch.wait[1])
        return []

    def _run_on_loop(self, operation: Operation[T] | OnSession[T]) -> T:
        return run_on_loop(self._loop, lambda: self._arun(operation))

    # -- schema ----------------------------------------------------------------------

    def setup(
        self,
        *,
        phase: _migrate.Phase = "all",
        lock_timeout: float = _migrate.DEFAULT_LOCK_TIMEOUT,
        lock_retries: int = _migrate.DEFAULT_LOCK_RETRIES,
        dry_run: bool = False,
        progress: _migrate.Progress | None = None,
    ) -> list[str]:
        """Create or upgrade the tables; safe to call from many processes at once and
        beside live workers. Returns the names of the migrations applied.

        Every statement waits at most ``lock_timeout`` seconds for its lock, then
        retries with backoff up to ``lock_retries`` times before raising
        ``MigrationLockTimeoutError``. ``dry_run`` only reads: it reports to ``progress``
        each statement that would run and returns the migrations that would apply.

        Through a connection pooler (PgBouncer, RDS Proxy, Supavisor...) it only checks
        that the schema is up to date, and refuses to migrate: run the migrations over a
        direct connection (see docs/how-to/adopting.md).

        Called on an event loop's thread, it blocks the loop while it runs (use
        ``await saver.asetup()``); its result may be awaited there, so the peer's
        ``await saver.setup()`` works. A saver with only an async connection refuses it
        there with ``SyncCallOnLoopError``, before anything runs.
        """
        on_loop = running_loop() is not None
        if on_loop and not self._has_sync():
            raise sync_on_loop_error("setup", "asetup")
        applied = self._run(
            partial(self._migration, phase, lock_timeout, lock_retries, dry_run, progress)
        )
        # On an event loop's thread, `await saver.setup()` (the peer's form) works too.
        return AwaitableList(applied) if on_loop else applied

    async def asetup(
        self,
        *,
        phase: _migrate.Phase = "all",
        lock_timeout: float = _migrate.DEFAULT_LOCK_TIMEOUT,
        lock_retries: int = _migrate.DEFAULT_LOCK_RETRIES,
        dry_run: bool = False,
        progress: _migrate.Progress | None = None,
    ) -> list[str]:
        """Async :meth:`setup`."""
        return await self._arun(
            partial(self._migration, phase, lock_timeout, lock_retries, dry_run, progress)
        )

    @staticmethod
    def _migration(
        phase: _migrate.Phase,
        lock_timeout: float,
        lock_retries: int,
        dry_run: bool,
        progress: _migrate.Progress | None,
        client_pid: int,
    ) -> Operation[list[str]]:
        policy = _migrate.LockPolicy(timeout=lock_timeout, retries=lock_retries)
        operation = _migrate.migrate(phase, policy=policy, dry_run=dry_run, progress=progress)
        if dry_run:
            return _migrate.named(operation)
        return _migrate.direct_only(phase, client_pid, _migrate.locked(operation, policy))

    def applied_migrations(self) -> set[int]:
        """Versions of this package's migrations applied to the database."""
        return self._run(_migrate.applied_versions())

    async def aapplied_migrations(self) -> set[int]:
        """Async :meth:`applied_migrations`."""
        return await self._arun(_migrate.applied_versions())

    # -- the retry contract ------------------------------------------------------------

    @property
    def contract(self) -> RunContract:
        """The run-id policy and metadata allow-list in force (see ``contract.py``)."""
        current = self._contract
        if (
            current is None
            or current.policy != self.run_id_policy
            or current.metadata_keys != self.metadata_keys
            or current.multitask_strategy != self.multitask_strategy
            or current.lease_ttl != self.lease_ttl
            or current.enqueue_timeout != self.enqueue_timeout
        ):
            current = self._contract = RunContract(
                self.run_id_policy,
                self.metadata_keys,
                multitask_strategy=self.multitask_strategy,
                lease_ttl=self.lease_ttl,
                enqueue_timeout=self.enqueue_timeout,
            )
        return current

    def get_run(self, thread_id: str, run_id: str | uuid.UUID) -> RunRecord | None:
        """A run from the ledger, with the checkpoint it wrote last (its final state once
        it has finished); None if this thread has no such run."""
        return self._run(_reads.get_run(self._codec, str(thread_id), str(run_id)))

    async def aget_run(self, thread_id: str, run_id: str | uuid.UUID) -> RunRecord | None:
        """Async :meth:`get_run`."""
        return await self._arun(_reads.get_run(self._codec, str(thread_id), str(run_id)))

    # -- pending writes of a superstep (see _writebuffer) -------------------------------

    def _writes_op(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Operation[None] | None:
        """The operation storing these writes now, or None: they wait for the put that
        continues their checkpoint (a graph run this saver admitted, plain writes only).
        ``loop``: an async run's event loop, where their timed store would run."""
        op = _core.put_writes(self._codec, config, writes, task_id, task_path, self.contract)
        buffer = self._writes
        configurable = config.get("configurable") or {}
        if buffer is None or not writes or "thread_id" not in configurable:
            return op
        thread_id = str(configurable["thread_id"])
        key = (str(configurable.get("checkpoint_ns") or ""), str(configurable.get("checkpoint_id")))
        attempt = self._admitted_attempt(config, thread_id)
        if (
            attempt is None
            or task_id == NULL_TASK_ID
            or any(channel in WRITES_IDX_MAP for channel, _ in writes)
        ):
            # Stored now, with the writes of the same checkpoint waiting so far.
            waiting = [] if attempt is None else buffer.take(attempt, key, seal=False)[0]
            return writes_first(op, waiting) if waiting else op
        try:
            batch = next(op)  # serialised and checked now: errors surface from this call
        except StopIteration:
            return None
        op.close()
        buffer.add(attempt, thread_id, key, batch.statements, loop)
        return None

    def _put_op(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[Operation[RunnableConfig], Waiter | None]:
        """The put, carrying the writes waiting for its parent; or, while a timed store
        of those is in flight, a waiter: wait for it and ask again (so the checkpoint is
        never durable before them)."""
        configurable = config.get("configurable") or {}
        parent = configurable.get("checkpoint_id")
        waiting: list[Statement] = []
        waiter: Waiter | None = None
        if self._writes is not None and parent and "thread_id" in configurable:
            attempt = self._admitted_attempt(config, str(configurable["thread_id"]))
            if attempt is not None:
                waiting, waiter = self._writes.take(
                    attempt, (str(configurable.get("checkpoint_ns") or ""), str(parent)), seal=True
                )
        op = _core.put(
            self._codec, config, checkpoint, metadata, new_versions, self.contract,
            pending=waiting,
        )  # fmt: skip
        return op, waiter

    def _admitted_attempt(self, config: RunnableConfig, thread_id: str) -> str | None:
        """The attempt token of the graph run (root or subgraph) this call belongs to,
        if this saver admitted it and will hear it end; else None. Read from the call's
        run_config recorder: a run on a new thread has no token in its configs."""
        recorder = find_recorder(config)
        held = recorder.held if recorder is not None else None
        if held is None or held.thread_id != thread_id or not self._leases.holds(held.attempt):
            return None
        return held.attempt

    def _pending_of(self, config: RunnableConfig | None) -> Operation[None] | None:
        """Before a read of a thread: store the writes waiting on it, so this process
        reads its own writes."""
        configurable = (config or {}).get("configurable") or {}
        if self._writes is None or "thread_id" not in configurable:
            return None
        ns = configurable.get("checkpoint_ns")
        waiting = self._writes.take_thread(
            str(configurable["thread_id"]), None if ns is None else str(ns)
        )
        return store_leftovers(waiting) if waiting else None

    # -- BaseCheckpointSaver: sync ---------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if (pending := self._pending_of(config)) is not None:
            self._run(pending)
        journal = JOURNAL_ADMISSION.get()
        before, asked = (None, 0.0) if journal is None else (_held(config), time.monotonic())
        attempt = None if journal is None else journal[0]
        found = self._run(_reads.get_tuple(self._codec, config, self.contract, attempt))
        self._leases.bind(config, is_async=False)
        _announce("load", config, _found_id(found))
        if journal is not None:
            _admitted(self, journal, config, before, asked)
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if (pending := self._pending_of(config)) is not None:
            self._run(pending)
        yield from self._run(_reads.list_checkpoints(self._codec, config, filter, before, limit))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        _announce("put", config, str(checkpoint["id"]))
        op, waiter = self._put_op(config, checkpoint, metadata, new_versions)
        while waiter is not None:
            if isinstance(waiter, threading.Event):
                waiter.wait()
            else:  # an async run's store, on its loop: wait from here
                wait_from_thread(waiter)
            op, waiter = self._put_op(config, checkpoint, metadata, new_versions)
        return self._run(op)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if (op := self._writes_op(config, writes, task_id, task_path)) is not None:
            self._run(op)

    def put_batch(
        self,
        items: Sequence[_core.BufferedWrite],
        *,
        release: tuple[HeldLease, str] | None = None,
    ) -> str | None:
        """:meth:`aput_batch`, sync."""
        return self._run(_core.put_batch(self._codec, items, self.contract, release))

    def delete_thread(self, thread_id: str) -> None:
        self._run(_core.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(_core.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(_core.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(_core.prune(thread_ids, strategy))

    def sweep(
        self,
        policy: RetentionPolicy | None = None,
        *,
        older_than: _dt.timedelta | str | None = None,
        strategy: str = "delete",
        apply: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
        now: _dt.datetime | None = None,
    ) -> SweepReport:
        """Find (and with ``apply=True`` remove) the threads past their TTL.

        Pass a :class:`~langgraph_deterministic.RetentionPolicy`, or ``older_than`` (a
        timedelta or ``"30d"``) and ``strategy`` (``"delete"``: whole threads;
        ``"keep_latest"``: each thread's latest checkpoint stays) for one with the other
        settings' defaults. A dry run (the default) writes nothing. Threads with work in
        progress are left as they are and reported (``SweepReport.skipped``); each swept
        thread is one transaction, so a sweep killed midway is finished by the next one.
        ``now``: the time ages are measured from (default: this machine's clock), to see
        what a sweep at a later time would remove. See docs/how-to/retention.md and
        :mod:`langgraph_deterministic.retention`.
        """
        from langgraph_deterministic import retention

        steps = retention.plan(
            _policy(policy, older_than, strategy), apply=apply, progress=progress, now=now
        )
        return retention.drive(steps, self._run)

    async def asweep(
        self,
        policy: RetentionPolicy | None = None,
        *,
        older_than: _dt.timedelta | str | None = None,
        strategy: str = "delete",
        apply: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
        now: _dt.datetime | None = None,
    ) -> SweepReport:
        """:meth:`sweep`, async."""
        from langgraph_deterministic import retention

        steps = retention.plan(
            _policy(policy, older_than, strategy), apply=apply, progress=progress, now=now
        )
        return await retention.adrive(steps, self._arun)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._run(_reads.delta_history(self._codec, config, channels))

    def get_next_version(self, current: str | None, channel: None) -> str:
        return next_version(current)

    # -- BaseCheckpointSaver: async --------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if (pending := self._pending_of(config)) is not None:
            await self._arun(pending)
        journal = JOURNAL_ADMISSION.get()
        before, asked = (None, 0.0) if journal is None else (_held(config), time.monotonic())
        attempt = None if journal is None else journal[0]
        found = await self._arun(_reads.get_tuple(self._codec, config, self.contract, attempt))
        self._leases.bind(config, is_async=True)
        _announce("load", config, _found_id(found))
        if journal is not None:
            _admitted(self, journal, config, before, asked)
        return found

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if (pending := self._pending_of(config)) is not None:
            await self._arun(pending)
        for item in await self._arun(
            _reads.list_checkpoints(self._codec, config, filter, before, limit)
        ):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        _announce("put", config, str(checkpoint["id"]))
        op, waiter = self._put_op(config, checkpoint, metadata, new_versions)
        while waiter is not None:
            if isinstance(waiter, threading.Event):
                await asyncio.to_thread(waiter.wait)
            else:
                await wait_shielded(waiter)
            op, waiter = self._put_op(config, checkpoint, metadata, new_versions)
        return await self._arun(op)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        loop = asyncio.get_running_loop()
        if (op := self._writes_op(config, writes, task_id, task_path, loop)) is not None:
            await self._arun(op)

    async def aput_batch(
        self,
        items: Sequence[_core.BufferedWrite],
        *,
        release: tuple[HeldLease, str] | None = None,
    ) -> str | None:
        """Store buffered ``aput``/``aput_writes`` calls of one run in one transaction.

        For DeterministicRunner under a durable journal: it buffers a run's writes and
        commits them once. Idempotent per run: when the checkpoint the run started from
        already has a child written by the same run (an earlier commit got through),
        nothing is written and that child's id is returned; otherwise None. ``release``
        (the lease from :meth:`astart_journaled_run`, ``"ok"`` or ``"error"``): the commit
        ends the run and frees its thread in the same transaction.
        """
        return await self._arun(_core.put_batch(self._codec, items, self.contract, release))

    async def astart_journaled_run(
        self, config: RunnableConfig
    ) -> tuple[CheckpointTuple | None, HeldLease | None]:
        """:meth:`aget_tuple` for the start of a graph run DeterministicRunner drives under
        a durable journal: the same admission and start checks, but the lease is returned
        instead of being released when this process's graph call returns or raises. Such a
        run outlives its attempts (a suspended or killed attempt raises through the graph
        call; a replay never loads the thread again), so its commit releases the lease
        (:meth:`aput_batch`) and the runner keeps it alive meanwhile (:meth:`keep_lease`).
        """
        found = await self._arun(_reads.get_tuple(self._codec, config, self.contract))
        recorder = find_recorder(config)
        held = None
        if recorder is not None:
            held, recorder.held = recorder.held, None
        return found, held

    def keep_lease(self, held: HeldLease, *, alive: bool = True) -> None:
        """Renew ``held`` by this saver's heartbeat (``alive=False``: stop renewing it;
        the lease then ends at its release or expires)."""
        if alive:
            self._leases.keep(held)
        else:
            self._leases.forget(held)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(_core.delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(_core.delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(_core.copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(_core.prune(thread_ids, strategy))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._arun(_reads.delta_history(self._codec, config, channels))


def _policy(
    policy: RetentionPolicy | None, older_than: _dt.timedelta | str | None, strategy: str
) -> RetentionPolicy:
    from langgraph_deterministic.retention import RetentionPolicy, parse_duration

    if policy is not None:
        if older_than is not None:
            raise ConfigurationError(
                "sweep() takes a RetentionPolicy or older_than=, not both: put the TTL in "
                "the policy (RetentionPolicy(default_ttl=...))."
            )
        return policy
    if older_than is None:
        raise ConfigurationError(
            "sweep() needs a TTL: sweep(older_than='30d') or sweep(RetentionPolicy(...))."
        )
    ttl = parse_duration(older_than) if isinstance(older_than, str) else older_than
    return RetentionPolicy(default_ttl=ttl, strategy=strategy)  # type: ignore[arg-type]


def _none(attempt: str) -> list[Statement]:
    return []



__all__ = [
    "CHECKPOINT_EVENTS",
    "JOURNAL_ADMISSION",
    "ConnectionSource",
    "DeterministicSaver",
    "RunIdPolicy",
    "SyncCallOnLoopError",
]

AbstractContextManager.register(DeterministicSaver)
AbstractAsyncContextManager.register(DeterministicSaver)
