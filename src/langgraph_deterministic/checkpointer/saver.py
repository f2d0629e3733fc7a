"""DeterministicSaver: one class, sync and async, over the sans-I/O core in ``_core``.

The drivers (``_drivers``) only execute :class:`~._batch.Batch` objects on a connection. A pool
gives every concurrent call its own connection, with no saver-wide lock (the peer takes
one lock per saver, which serialises all async work even with a pool); a single
connection is shared under a lock, since one connection runs one transaction at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dis
import enum
import inspect
import logging
import threading
import time
import uuid
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from contextvars import ContextVar
from functools import partial
from types import TracebackType
from typing import Any, Literal, TypeVar

import psycopg
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
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg import AsyncConnection, Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_deterministic._compat.langgraph import NULL_TASK_ID
from langgraph_deterministic.checkpointer import _core, _migrate
from langgraph_deterministic.checkpointer._batch import (
    Batch,
    Operation,
    Results,
    Statement,
    arun,
    run,
    store,
    writes_first,
)
from langgraph_deterministic.checkpointer._drivers import aexecute, execute
from langgraph_deterministic.checkpointer._leases import LeaseKeeper
from langgraph_deterministic.checkpointer._rows import Codec, next_version
from langgraph_deterministic.checkpointer._translate import translate_error
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
from langgraph_deterministic.errors import ConfigurationError, SaverClosedError
from langgraph_deterministic.pool import AsyncConnectionPool as AsyncNewestFirstPool
from langgraph_deterministic.pool import ConnectionPool as NewestFirstPool

logger = logging.getLogger("langgraph_deterministic")

T = TypeVar("T")
RunIdPolicy = Literal["require", "warn", "off"]
ConnectionSource = (
    str | Connection[Any] | AsyncConnection[Any] | ConnectionPool[Any] | AsyncConnectionPool[Any]
)

# An operation that needs the session's client-side backend pid (see _setup).
OnSession = Callable[[int], Operation[T]]

# Connect timeout of a DSN saver's first connection when neither the DSN nor
# connect_kwargs set one.
_PROBE_TIMEOUT = 10


#: Set by PostgresJournal's session (runner/_postgres.py) for one runner call: told of
#: every checkpoint this saver loads ("load", the id found or None) and, before it is sent,
#: of every one it writes ("put") in that call. A task running from a checkpoint its own
#: attempt created then needs no claim before its first durable op.
CHECKPOINT_EVENTS: ContextVar[Callable[[str, RunnableConfig, str | None], None] | None] = (
    ContextVar("lgd_checkpoint_events", default=None)
)


#: Set by PostgresJournal's session for one runner call: ``(attempt, admitted)``. A graph
#: run of that attempt this saver admits registers the attempt in the journal in the same
#: statement (``lgd_journal_admit_v1``); ``admitted(saver, held, asked)`` hears of it, with
#: ``held.fence_at`` and the local monotonic time the admission was sent (its answer is
#: no older). The run's first op then needs no claim of its own.
JOURNAL_ADMISSION: ContextVar[tuple[str, Callable[[Any, HeldLease, float], None]] | None] = (
    ContextVar("lgd_journal_admission", default=None)
)


def _held(config: RunnableConfig) -> HeldLease | None:
    recorder = find_recorder(config)
    return None if recorder is None else recorder.held


def _admitted(
    saver: Any,
    journal: tuple[str, Callable[[Any, HeldLease, float], None]],
    config: RunnableConfig,
    before: HeldLease | None,
    asked: float,
) -> None:
    """Tell the journal's session of an admission this load made (not of an earlier one)."""
    held = _held(config)
    if held is None or held is before or held.fence_at is None or held.attempt != journal[0]:
        return
    journal[1](saver, held, asked)


def _announce(kind: str, config: RunnableConfig, checkpoint_id: str | None) -> None:
    listener = CHECKPOINT_EVENTS.get()
    if listener is not None:
        listener(kind, config, checkpoint_id)


def _found_id(found: CheckpointTuple | None) -> str | None:
    return None if found is None else str(found.config["configurable"]["checkpoint_id"])


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET = _Unset.UNSET


# --- the saver ----------------------------------------------------------------------


class SyncCallOnLoopError(ConfigurationError, asyncio.InvalidStateError):
    """A sync method over an async connection, called from its event loop. Also an
    ``asyncio.InvalidStateError``, which AsyncPostgresSaver raises in that case."""



class DeterministicSaver(BaseCheckpointSaver[str]):
    """A Postgres checkpointer for LangGraph, drop-in compatible with
    ``langgraph-checkpoint-postgres`` (same tables), with the sync and the async API.

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
    ) -> None:
        super().__init__(serde=serde or JsonPlusSerializer())  # sets self.serde (below)
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
        self._dsn: str | None = None
        self._pool: ConnectionPool[Any] | None = None
        self._apool: AsyncConnectionPool[Any] | None = None
        self._apool_guard: AsyncGenerator[None, None] | None = None
        self._apool_loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection[Any] | None = None
        self._aconn: AsyncConnection[Any] | None = None
        self._owns_pools = False
        self._closed = False
        # A pool whose kwargs cannot tell (a configure callback, callable kwargs): check
        # each connection it hands out (an attribute read, no round trip).
        self._check_pool = False
        self._lock = threading.Lock()  # guards a single shared Connection / pool creation
        self._alock: asyncio.Lock | None = None  # guards a single shared AsyncConnection
        self._loop: asyncio.AbstractEventLoop | None = None
        pool_options = {
            "pool_min_size": pool_min_size,
            "pool_max_size": pool_max_size,
            "connect_kwargs": connect_kwargs,
        }
        given = [k for k, v in pool_options.items() if v is not None]
        if prepare_threshold is not _UNSET:
            given.append("prepare_threshold")
        if given and not isinstance(conn, str):
            raise ConfigurationError(
                f"{', '.join(given)} configure the pools a DSN saver creates; this saver was "
                f"given a {type(conn).__name__}. Set them on it instead (for a pool: "
                'kwargs={"autocommit": True, "prepare_threshold": ...}, min_size, max_size).'
            )
        if isinstance(conn, str):
            self._dsn = conn
            self._owns_pools = True
            _check_dsn(conn)
            self._pool_min_size = 1 if pool_min_size is None else pool_min_size
            self._pool_max_size = 10 if pool_max_size is None else pool_max_size
            if not 0 <= self._pool_min_size <= self._pool_max_size or self._pool_max_size < 1:
                raise ConfigurationError(
                    f"pool_min_size={self._pool_min_size} and pool_max_size="
                    f"{self._pool_max_size} are not a valid pool size: need "
                    "0 <= pool_min_size <= pool_max_size and pool_max_size >= 1."
                )
            self._connect_kwargs = _owned_connect_kwargs(connect_kwargs, prepare_threshold)
        elif isinstance(conn, ConnectionPool):
            self._check_pool = _require_pool_autocommit(conn)
            self._pool = conn
        elif isinstance(conn, AsyncConnectionPool):
            self._check_pool = _require_pool_autocommit(conn)
            self._apool = conn
        elif isinstance(conn, Connection):
            _require_autocommit(conn)
            self._conn = conn
        elif isinstance(conn, AsyncConnection):
            _require_autocommit(conn)
            self._aconn = conn
        else:
            raise ConfigurationError(
                f"DeterministicSaver cannot use a {type(conn).__name__} as its connection. "
                "Pass a DSN string, a psycopg (Async)Connection, or a psycopg_pool "
                "(Async)ConnectionPool."
            )
        if not self._has_sync():
            # The loop the sync API hands its calls to (as AsyncPostgresSaver), known
            # before the first async call when the saver is built on it.
            with suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()

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
        )

    # -- connections ---------------------------------------------------------------

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise SaverClosedError(
                "This DeterministicSaver was closed (close()/aclose(), or its with-block "
                "ended); it no longer has connections. Create a new saver, or keep using "
                "it inside its with-block."
            )

    def _sync_pool(self) -> ConnectionPool[Any] | None:
        self._refuse_if_closed()
        if self._pool is None and self._dsn is not None:
            with self._lock:
                if self._pool is None:
                    # Connect once directly first: a pool retries a refused connection
                    # until its timeout and then reports only that it timed out.
                    direct = _probe(self._dsn, self._connect_kwargs)
                    pool: ConnectionPool[Any] = NewestFirstPool(
                        self._dsn,
                        min_size=self._pool_min_size,
                        max_size=self._pool_max_size,
                        kwargs=self._pool_kwargs(direct),
                        open=False,
                        name="langgraph-deterministic",
                    )
                    pool.open(wait=False)
                    self._pool = pool
        return self._pool

    async def _async_pool(self) -> AsyncConnectionPool[Any] | None:
        self._refuse_if_closed()
        if self._apool is None and self._dsn is not None:
            if self._alock is None:
                self._alock = asyncio.Lock()
            async with self._alock:
                if self._apool is None:
                    direct = await _aprobe(self._dsn, self._connect_kwargs)
                    self._refuse_if_closed()
                    opened: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()

                    async def track(conn: AsyncConnection[Any]) -> None:
                        opened.add(conn)

                    pool: AsyncConnectionPool[Any] = AsyncNewestFirstPool(
                        self._dsn,
                        min_size=self._pool_min_size,
                        max_size=self._pool_max_size,
                        kwargs=self._pool_kwargs(direct),
                        configure=track,
                        open=False,
                        name="langgraph-deterministic-async",
                    )
                    await pool.open(wait=False)
                    # Closed with its event loop: asyncio.run() finalises open async
                    # generators before it closes the loop, so a saver used without
                    # `async with` still leaves no pool workers or connections behind.
                    guard = _close_with_loop(pool, opened, self._forget_async_pool)
                    await anext(guard)
                    self._apool, self._apool_guard = pool, guard
                    self._apool_loop = asyncio.get_running_loop()
        return self._apool

    def _pool_kwargs(self, direct: bool) -> dict[str, Any]:
        """Behind a pooler (found by the first connection), a DSN saver prepares nothing
        unless told otherwise: PgBouncer before 1.21 in transaction mode cannot route a
        prepared statement's EXECUTE to the session that prepared it."""
        if direct or "prepare_threshold" in self._connect_kwargs:
            return self._connect_kwargs
        return {**self._connect_kwargs, "prepare_threshold": None}

    def _forget_async_pool(self, pool: AsyncConnectionPool[Any]) -> None:
        """Its event loop ended: a later loop gets a new pool."""
        if self._apool is pool:
            self._apool = self._apool_guard = self._apool_loop = None
            self._alock = None  # an asyncio.Lock may be bound to the loop that ended

    @contextmanager
    def _connection(self) -> Iterator[Connection[Any]]:
        self._refuse_if_closed()
        if self._conn is not None:
            with self._lock:
                yield self._conn
            return
        pool = self._sync_pool()
        assert pool is not None
        with pool.connection() as conn:
            if self._check_pool:
                _require_autocommit(conn, pool=True)
            yield conn

    @asynccontextmanager
    async def _aconnection(self) -> AsyncIterator[AsyncConnection[Any]]:
        self._refuse_if_closed()
        if self._aconn is not None:
            if self._alock is None:
                self._alock = asyncio.Lock()
            async with self._alock:
                yield self._aconn
            return
        pool = await self._async_pool()
        assert pool is not None
        async with pool.connection() as conn:
            if self._check_pool:
                _require_autocommit(conn, pool=True)
            yield conn

    def _has_sync(self) -> bool:
        return self._conn is not None or self._pool is not None or self._dsn is not None

    def _has_async(self) -> bool:
        return self._aconn is not None or self._apool is not None or self._dsn is not None

    # -- running operations ----------------------------------------------------------

    # A call on a pool checks a connection out and back in directly: pool.connection()
    # would add two context managers and a commit() per call, a no-op on an autocommit
    # connection (putconn rolls back any transaction left open, as that commit's rollback
    # on error would). Client CPU: every call of a graph run pays it (16 calls per graph
    # run of bench_saver's graph: pool.connection() cost 1.3% more client instructions,
    # callgrind, benchmarks/profile_client.py). What connection() counts in the pool's
    # get_stats()["usage_ms"] is counted alike (_count_usage).

    def _run(self, operation: Operation[T] | OnSession[T]) -> T:
        pool = self._pool
        if pool is not None and not self._closed:
            with _TRANSLATED:
                conn = pool.getconn()
                t0 = time.monotonic()
                try:
                    if self._check_pool:
                        _require_autocommit(conn, pool=True)
                    op = operation(conn.info.backend_pid) if callable(operation) else operation
                    return run(op, lambda batch: execute(conn, batch))
                finally:
                    pool.putconn(conn)
                    _count_usage(pool, t0)
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
        if pool is not None and not self._closed:
            with _TRANSLATED:
                conn = await pool.getconn()
                t0 = time.monotonic()
                try:
                    if self._check_pool:
                        _require_autocommit(conn, pool=True)
                    op = operation(conn.info.backend_pid) if callable(operation) else operation
                    return await arun(op, lambda batch: aexecute(conn, batch))
                finally:
                    await pool.putconn(conn)
                    _count_usage(pool, t0)
        with _TRANSLATED:
            async with self._aconnection() as conn:
                op = operation(conn.info.backend_pid) if callable(operation) else operation
                if conn is self._aconn:
                    return await arun(op, partial(self._aexecute_shared, conn))
                return await arun(op, lambda batch: aexecute(conn, batch))

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
        """The sync API over an async connection: allowed from a thread other than the
        event loop's (e.g. a sync node run by LangGraph's executor)."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or not loop.is_running():
            raise SyncCallOnLoopError(
                "This saver was given an async connection, so its sync methods work only "
                "from another thread while its event loop runs. Use the async API "
                "(graph.ainvoke/astream) or give the saver a DSN, a Connection or a "
                "ConnectionPool."
            )
        return asyncio.run_coroutine_threadsafe(self._arun(operation), loop).result()

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> DeterministicSaver:
        self._refuse_if_closed()
        if self._dsn is not None:
            self._sync_pool()  # a wrong DSN fails here, with the server's own reason
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> DeterministicSaver:
        self._refuse_if_closed()
        if self._dsn is not None:
            await self._async_pool()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def close(self) -> None:
        """Close the pools this saver created from a DSN (never a pool or connection you
        passed in); the saver cannot be used afterwards. From inside a coroutine running
        on the loop of the saver's async pool, use ``await saver.aclose()``."""
        self._leases.close()
        if self._writes is not None:
            self._writes.close()
        guard, loop = self._apool_guard, self._apool_loop
        if guard is not None and loop is not None and not loop.is_closed():
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise ConfigurationError(
                    "close() cannot wait for the async pool from inside its own event loop; "
                    "use `await saver.aclose()` (or `async with`)."
                )
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(guard.aclose(), loop).result()
            else:
                loop.run_until_complete(guard.aclose())
        self._closed = True
        self._apool = self._apool_guard = self._apool_loop = None
        if self._owns_pools and self._pool is not None:
            self._pool.close()
            self._pool = None

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        self._closed = True
        self._leases.close()
        if self._writes is not None:
            self._writes.close()
        if self._owns_pools:
            guard, loop = self._apool_guard, self._apool_loop
            self._apool = self._apool_guard = self._apool_loop = None
            if guard is not None:
                if loop is asyncio.get_running_loop():
                    await guard.aclose()
                elif loop is not None and loop.is_running():
                    closing = asyncio.run_coroutine_threadsafe(guard.aclose(), loop)
                    await asyncio.wrap_future(closing)
            if self._pool is not None:
                await asyncio.to_thread(self._pool.close)
                self._pool = None

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
        """
        _refuse_from_coroutine("setup", "asetup")
        return self._run(
            partial(self._migration, phase, lock_timeout, lock_retries, dry_run, progress)
        )

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
        return self._run(_core.get_run(self._codec, str(thread_id), str(run_id)))

    async def aget_run(self, thread_id: str, run_id: str | uuid.UUID) -> RunRecord | None:
        """Async :meth:`get_run`."""
        return await self._arun(_core.get_run(self._codec, str(thread_id), str(run_id)))

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
        if buffer.add(attempt, thread_id, key, batch.statements, loop):
            return None
        # The put continuing this checkpoint went out already: store them on their own.
        return _core.put_writes(self._codec, config, writes, task_id, task_path, self.contract)

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
        found = self._run(_core.get_tuple(self._codec, config, self.contract, attempt))
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
        yield from self._run(_core.list_checkpoints(self._codec, config, filter, before, limit))

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
                asyncio.run_coroutine_threadsafe(_wait(waiter), waiter.get_loop()).result()
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

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._run(_core.delta_history(self._codec, config, channels))

    def get_next_version(self, current: str | None, channel: None) -> str:
        return next_version(current)

    # -- BaseCheckpointSaver: async --------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if (pending := self._pending_of(config)) is not None:
            await self._arun(pending)
        journal = JOURNAL_ADMISSION.get()
        before, asked = (None, 0.0) if journal is None else (_held(config), time.monotonic())
        attempt = None if journal is None else journal[0]
        found = await self._arun(_core.get_tuple(self._codec, config, self.contract, attempt))
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
            _core.list_checkpoints(self._codec, config, filter, before, limit)
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
                await _wait(waiter)
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
        found = await self._arun(_core.get_tuple(self._codec, config, self.contract))
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
        return await self._arun(_core.delta_history(self._codec, config, channels))


def _none(attempt: str) -> list[Statement]:
    return []


async def _wait(waiter: asyncio.Future[None]) -> None:
    await asyncio.shield(waiter)  # a cancelled put must not cancel the store it waits for


def _check_dsn(dsn: str) -> None:
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(
            f"The connection string is not valid: {exc}. Pass a libpq URI such as "
            "'postgresql://user:password@host:5432/dbname' or a 'key=value' string."
        ) from exc


_AUTOCOMMIT_WHY = (
    "it opens its own transactions, and a read left idle in a transaction would hold "
    "locks (and a failed statement would poison the connection for the next caller)."
)


class _Translated:
    """Re-raises a driver error as the library's own (``translate_error``), caused by it;
    anything else passes. One instance serves every call, sync and async (it keeps no
    state), so the hot path pays a with-statement, not a generator."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, Exception):
            translated = translate_error(exc)
            if translated is not exc:
                raise translated from exc


_TRANSLATED = _Translated()


def _count_usage(pool: ConnectionPool[Any] | AsyncConnectionPool[Any], t0: float) -> None:
    """Add a checkout's time to the pool's ``usage_ms`` statistic, as its ``connection()``
    does (whole milliseconds per checkout, the putconn included). psycopg_pool keeps its
    counters in private names: where they are not there, nothing is counted."""
    stats = getattr(pool, "_stats", None)
    key = getattr(pool, "_USAGE_MS", None)
    if stats is not None and key is not None:
        stats[key] += int(1000.0 * (time.monotonic() - t0))


def _require_autocommit(conn: Connection[Any] | AsyncConnection[Any], pool: bool = False) -> None:
    if conn.autocommit:
        return
    if pool:
        raise ConfigurationError(
            "DeterministicSaver needs the pool's connections in autocommit mode; this pool "
            f"handed out one that is not: {_AUTOCOMMIT_WHY} Create the pool with "
            'kwargs={"autocommit": True} (or set conn.autocommit = True in its configure '
            "callback)."
        )
    raise ConfigurationError(
        f"DeterministicSaver needs its connection in autocommit mode: {_AUTOCOMMIT_WHY} "
        "Connect with psycopg.connect(dsn, autocommit=True) (or pass a pool or a DSN)."
    )


def _require_pool_autocommit(pool: ConnectionPool[Any] | AsyncConnectionPool[Any]) -> bool:
    """Refuse a pool whose kwargs say its connections are not in autocommit mode. Returns
    True when the kwargs cannot tell (a configure callback may set it, or kwargs is a
    callable): then each connection is checked as it is handed out."""
    kwargs = pool.kwargs
    if callable(kwargs):
        return True
    if kwargs and "autocommit" in kwargs:
        declared = bool(kwargs["autocommit"])
    elif getattr(pool, "_configure", None) is not None:
        return True
    else:
        declared = False
    if not declared:
        raise ConfigurationError(
            "DeterministicSaver needs the pool's connections in autocommit mode: "
            f"{_AUTOCOMMIT_WHY} Create the pool with "
            'kwargs={"autocommit": True, "prepare_threshold": 0} (LangGraph\'s documented '
            "settings; row_factory may be anything)."
        )
    return False


def _owned_connect_kwargs(
    connect_kwargs: Mapping[str, Any] | None, prepare_threshold: int | _Unset | None
) -> dict[str, Any]:
    """Connection keywords of the pools a DSN saver owns. Autocommit, so a read is one
    round trip (no BEGIN/COMMIT around it); prepare_threshold=None prepares nothing
    server-side, as PgBouncer in transaction mode needs."""
    kwargs = dict(connect_kwargs or {})
    if kwargs.get("autocommit", True) is not True:
        raise ConfigurationError(
            f"DeterministicSaver needs autocommit connections: {_AUTOCOMMIT_WHY} Remove "
            "autocommit from connect_kwargs."
        )
    kwargs["autocommit"] = True
    if prepare_threshold is not _UNSET:
        if kwargs.get("prepare_threshold", prepare_threshold) != prepare_threshold:
            raise ConfigurationError(
                f"prepare_threshold={prepare_threshold!r} and connect_kwargs"
                f"['prepare_threshold']={kwargs['prepare_threshold']!r} disagree; pass one."
            )
        kwargs["prepare_threshold"] = prepare_threshold
    return kwargs


def _probe_kwargs(dsn: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    probe = dict(kwargs)
    if "connect_timeout" not in probe and "connect_timeout" not in conninfo_to_dict(dsn):
        probe["connect_timeout"] = _PROBE_TIMEOUT
    return probe


def _probe(dsn: str, kwargs: Mapping[str, Any]) -> bool:
    """Connect once, directly: a pool would retry a refused connection until its
    timeout and then report only that it timed out. Returns whether the connection
    reaches Postgres without a pooler in between."""
    try:
        with psycopg.connect(dsn, **_probe_kwargs(dsn, kwargs)) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            row = cur.execute(_migrate.BACKEND_PID_SQL, prepare=False).fetchone()
            return row is not None and row[0] == conn.info.backend_pid
    except psycopg.Error as exc:
        raise translate_error(exc) from exc


async def _aprobe(dsn: str, kwargs: Mapping[str, Any]) -> bool:
    try:
        async with await AsyncConnection.connect(dsn, **_probe_kwargs(dsn, kwargs)) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(_migrate.BACKEND_PID_SQL, prepare=False)
            row = await cur.fetchone()
            return row is not None and row[0] == conn.info.backend_pid
    except psycopg.Error as exc:
        raise translate_error(exc) from exc


async def _close_with_loop(
    pool: AsyncConnectionPool[Any],
    opened: weakref.WeakSet[AsyncConnection[Any]],
    forget: Callable[[AsyncConnectionPool[Any]], None],
) -> AsyncGenerator[None, None]:
    """Suspended for the pool's lifetime; finalised by aclose(), or by the event loop's
    shutdown_asyncgens() (asyncio.run calls it) when the saver was never closed."""
    closer = asyncio.ensure_future(_close_when_cancelled(pool, opened))
    try:
        yield
    finally:
        forget(pool)
        await _close_pool(pool, opened)
        closer.cancel()  # closed already: its close is a no-op


async def _close_pool(
    pool: AsyncConnectionPool[Any], opened: weakref.WeakSet[AsyncConnection[Any]]
) -> None:
    # Cancelled: the loop is shutting down (asyncio.run cancelled the pool's workers), so
    # the pool gave up before closing its connections. Nothing runs on this loop any
    # more: close them here.
    with contextlib.suppress(asyncio.CancelledError):
        await pool.close()
    for conn in list(opened):
        if not conn.closed:
            await conn.close()


async def _close_when_cancelled(
    pool: AsyncConnectionPool[Any], opened: weakref.WeakSet[AsyncConnection[Any]]
) -> None:
    """Close the pool when asyncio.run cancels every task at the loop's end, before it
    waits for them. psycopg_pool's workers catch CancelledError around a maintenance task
    (a connection being opened, say) and go back to waiting on their queue: cancelled
    then, one never ends and asyncio.run hangs. Closing the pool sends each worker its
    stop; the async generator above runs only later (shutdown_asyncgens)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await _close_pool(pool, opened)
        raise


async def _wait_unlocked(lock: asyncio.Lock, seconds: float) -> None:
    """Sleep with ``lock`` given up, and hold it again on return, also when cancelled
    (asyncio.Condition.wait's rule: the cancellation is raised once the lock is held)."""
    lock.release()
    try:
        await asyncio.sleep(seconds)
    finally:
        cancelled = False
        while True:
            try:
                await lock.acquire()
                break
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError


def _refuse_from_coroutine(name: str, async_name: str) -> None:
    """Refuse ``await saver.<name>()`` before anything runs: the sync method would block
    the event loop, then fail on awaiting its result. A plain call from a coroutine (as
    the peer's sync saver allows) goes on; only an awaited one is refused."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    flags = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
    if caller is None or not caller.f_code.co_flags & flags:
        return
    # f_lasti is the call being made (3.11: its last inline cache entry); the instruction
    # after it is what the caller does with the result.
    following = next(
        (ins for ins in dis.get_instructions(caller.f_code) if ins.offset > caller.f_lasti), None
    )
    if following is not None and following.opname == "GET_AWAITABLE":
        raise ConfigurationError(
            f"`await saver.{name}()`: {name}() is the sync method. Use "
            f"`await saver.{async_name}()` in async code. Nothing was run."
        )


AbstractContextManager.register(DeterministicSaver)
AbstractAsyncContextManager.register(DeterministicSaver)
