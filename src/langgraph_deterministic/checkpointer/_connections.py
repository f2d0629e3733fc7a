"""The connections of a DeterministicSaver: what it accepts (DSN checks, autocommit
checks), the pools a DSN saver builds (a direct probe first), and how a call gets a
connection (a pool's own, or the one shared connection under a lock).

:class:`Connections` is a mixin of :class:`~.saver.DeterministicSaver`; the saver's
``_run`` / ``_arun`` execute operations on what it hands out.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_deterministic._db import migrate as _migrate
from langgraph_deterministic._db.translate import sentence, translate_error
from langgraph_deterministic._dsn import chained, masked, parse_error
from langgraph_deterministic.checkpointer._lifecycle import _close_with_loop
from langgraph_deterministic.errors import ConfigurationError, DeterministicError, SaverClosedError
from langgraph_deterministic.pool import AsyncConnectionPool as AsyncNewestFirstPool
from langgraph_deterministic.pool import ConnectionPool as NewestFirstPool

ConnectionSource = (
    str | Connection[Any] | AsyncConnection[Any] | ConnectionPool[Any] | AsyncConnectionPool[Any]
)

# Connect timeout of a DSN saver's first connection when neither the DSN nor
# connect_kwargs set one.
_PROBE_TIMEOUT = 10


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET = _Unset.UNSET


class Connections:
    """Connection state and acquisition of a saver (set up by :meth:`_init_connections`)."""

    def _init_connections(
        self,
        conn: ConnectionSource,
        pool_min_size: int | None,
        pool_max_size: int | None,
        prepare_threshold: int | _Unset | None,
        connect_kwargs: Mapping[str, Any] | None,
    ) -> None:
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


def _check_dsn(dsn: str) -> None:
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # from None: the driver's message quotes the token it refused (the password, say)
        raise ConfigurationError(
            f"The connection string is not valid: {sentence(parse_error(exc, dsn))} Pass a libpq "
            "URI such as 'postgresql://user:password@host:5432/dbname' (percent-encode "
            "%, @, : and / in the password) or a 'key=value' string."
        ) from None


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


def _pool_probe(
    pool: ConnectionPool[Any] | AsyncConnectionPool[Any],
) -> tuple[str, dict[str, Any]] | None:
    """The pool's conninfo and connection keywords, when they are fixed values."""
    kwargs, conninfo = pool.kwargs, pool.conninfo
    if callable(kwargs) or not isinstance(conninfo, str):
        return None  # its connections' arguments are not known before it connects
    probe = {k: v for k, v in (kwargs or {}).items() if k not in ("row_factory", "autocommit")}
    return conninfo, _probe_kwargs(conninfo, probe)


def pool_timeout_error(pool: ConnectionPool[Any], exc: Exception) -> BaseException:
    """The error for a pool that handed out no connection in time. A pool retries a
    refused login in the background and then reports only its timeout: one direct
    connection tells a permanent cause (no such database, a failed login: not retryable)
    from an exhausted or unreachable pool (retryable). Only on this failure path."""
    probe = _pool_probe(pool)
    if probe is not None:
        try:
            psycopg.connect(probe[0], **probe[1]).close()
        except psycopg.Error as refused:
            found = translate_error(refused)
            if isinstance(found, DeterministicError) and not found.retryable:
                return found
    return translate_error(exc)


async def apool_timeout_error(pool: AsyncConnectionPool[Any], exc: Exception) -> BaseException:
    """:func:`pool_timeout_error` for an async pool."""
    probe = _pool_probe(pool)
    if probe is not None:
        try:
            await (await AsyncConnection.connect(probe[0], **probe[1])).close()
        except psycopg.Error as refused:
            found = translate_error(refused)
            if isinstance(found, DeterministicError) and not found.retryable:
                return found
    return translate_error(exc)


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
    except psycopg.Error as exc:  # libpq may quote a host cut out of a password
        raise masked(translate_error(exc), exc, dsn) from chained(exc, dsn)


async def _aprobe(dsn: str, kwargs: Mapping[str, Any]) -> bool:
    try:
        async with await AsyncConnection.connect(dsn, **_probe_kwargs(dsn, kwargs)) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(_migrate.BACKEND_PID_SQL, prepare=False)
            row = await cur.fetchone()
            return row is not None and row[0] == conn.info.backend_pid
    except psycopg.Error as exc:  # libpq may quote a host cut out of a password
        raise masked(translate_error(exc), exc, dsn) from chained(exc, dsn)


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
