"""Waiting for a thread (``multitask_strategy="enqueue"``) without holding a pooled
connection.

A run queued behind another on its thread waits between two looks at its admission
(``_core._start_graph_run`` yields a ``Batch`` with ``wait``). A waiter that kept its
pooled connection through the wait would keep it from the run it waits for: a burst of
as many waiters as the pool has connections froze the thread (the holder could not get
a connection to write or to release its lease). So:

* the waiter gives its connection back to the pool for the wait, and takes one again
  (from the pool's queue, like any call) only to look at its admission again
  (:class:`Checkout`, :class:`ACheckout`);
* it is woken by one listener per saver (:class:`QueueListener`): a daemon thread with a
  connection of its own, outside the pool, LISTENing on ``lgd_queue``. A lease's release
  notifies that channel with the thread's channel name and its first live ticket
  (``lgd_wake_queue_v4``, migration 0024), so each process wakes only the waiter whose
  turn it is, in ticket order across processes. The listener connects on the first wait
  and closes after a minute without waiters.
* when the listener cannot connect or a NOTIFY does not reach it (PgBouncer in
  transaction mode), the waiter looks again after its pause (at most a second by
  default): slower, still FIFO, still without a connection held.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_deterministic._db.batch import Batch, Results
from langgraph_deterministic._db.drivers import aexecute, execute

logger = logging.getLogger("langgraph_deterministic")

#: The channel every lease release with waiters notifies (migration 0024).
CHANNEL = "lgd_queue"
#: The listener closes its connection after this long without waiters (seconds).
IDLE_CLOSE = 60.0
_CONNECT_TIMEOUT = 5


class QueueListener:
    """One LISTEN connection per saver; wakes the waiter whose ticket a release names."""

    def __init__(self, connect: Callable[[], Connection[Any]] | None) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        # (thread channel, ticket) -> wake-ups of the waiters for it
        self._waiters: dict[tuple[str, int], list[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed_at = 0.0
        self._closed = False

    # -- waiters ------------------------------------------------------------------------

    def _register(self, key: tuple[str, int], wake: Callable[[], None]) -> bool:
        """Register ``wake``; False when no listener runs (the waiter just sleeps)."""
        if self._connect is None or self._closed:
            return False
        with self._lock:
            self._waiters.setdefault(key, []).append(wake)
            if self._thread is None or not self._thread.is_alive():
                if time.monotonic() - self._failed_at < 5.0:
                    return False  # it failed to connect a moment ago: do not hammer
                self._ready.clear()
                self._thread = threading.Thread(
                    target=self._listen, name="langgraph-deterministic-queue", daemon=True
                )
                self._thread.start()
        return True

    def _unregister(self, key: tuple[str, int], wake: Callable[[], None]) -> None:
        with self._lock:
            wakes = self._waiters.get(key)
            if wakes and wake in wakes:
                wakes.remove(wake)
                if not wakes:
                    del self._waiters[key]

    def wait(self, channel: str, ticket: int | None, seconds: float) -> bool:
        """Sleep up to ``seconds``, or until a release wakes ``ticket`` of ``channel``
        (returns True then)."""
        event = threading.Event()
        key = (channel, ticket if ticket is not None else -1)
        if not self._register(key, event.set):
            time.sleep(seconds)
            return False
        try:
            deadline = time.monotonic() + seconds
            self._ready.wait(min(seconds, _CONNECT_TIMEOUT))  # the listener's LISTEN
            return event.wait(max(0.0, deadline - time.monotonic()))
        finally:
            self._unregister(key, event.set)

    def listening(self, timeout: float) -> bool:
        """Whether the listener is up (LISTENing), waiting up to ``timeout`` for it."""
        return self._ready.wait(timeout)

    async def await_(self, channel: str, ticket: int | None, seconds: float) -> bool:
        """:meth:`wait` for a coroutine: the event loop is never blocked."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        key = (channel, ticket if ticket is not None else -1)
        if not self._register(key, wake):
            await asyncio.sleep(seconds)
            return False
        try:
            await asyncio.wait_for(woken.wait(), seconds)
            return True
        except TimeoutError:
            return False
        finally:
            self._unregister(key, wake)

    def close(self) -> None:
        self._closed = True

    # -- the listener thread ------------------------------------------------------------

    def _listen(self) -> None:
        assert self._connect is not None
        try:
            conn = self._connect()
        except Exception as exc:  # the waiters fall back to their pause
            self._failed_at = time.monotonic()
            logger.warning(
                "langgraph-deterministic: enqueue waiters cannot listen for releases (%s); "
                "they look again after their pause instead.",
                exc,
            )
            return
        idle_since: float | None = None
        try:
            with conn:
                conn.execute(f'LISTEN "{CHANNEL}"')
                self._ready.set()
                while not self._closed:
                    for note in conn.notifies(timeout=1.0):
                        self._dispatch(note.payload)
                    with self._lock:
                        if self._waiters:
                            idle_since = None
                            continue
                        now = time.monotonic()
                        if idle_since is None:
                            idle_since = now
                        elif now - idle_since > IDLE_CLOSE:
                            self._thread = None
                            return
        except Exception as exc:
            self._failed_at = time.monotonic()
            logger.warning("langgraph-deterministic: the enqueue listener stopped: %s", exc)
        finally:
            self._ready.clear()

    def _dispatch(self, payload: str) -> None:
        channel, _, ticket = payload.partition(" ")
        try:
            key = (channel, int(ticket))
        except ValueError:
            return
        with self._lock:
            wakes = list(self._waiters.get(key, ()))
        for wake in wakes:
            wake()


def listener_for(conninfo: str | None, kwargs: Mapping[str, Any] | None) -> QueueListener:
    """A listener connecting with ``conninfo`` and ``kwargs`` (a pool's, or a DSN
    saver's); without a conninfo, waiters sleep their pause."""
    if conninfo is None:
        return QueueListener(None)
    options = {
        k: v for k, v in (kwargs or {}).items() if k not in ("row_factory", "prepare_threshold")
    }
    options["autocommit"] = True
    options.setdefault("connect_timeout", _CONNECT_TIMEOUT)

    def connect() -> Connection[Any]:
        return psycopg.connect(conninfo, **options)

    return QueueListener(connect)


class Checkout:
    """A pooled connection for one operation, given back to the pool while the operation
    waits (a ``Batch`` with ``wait``) and taken again for its next statements."""

    __slots__ = ("_check", "_execute", "_listener", "_pool", "conn")

    def __init__(
        self,
        pool: ConnectionPool[Any],
        conn: Connection[Any],
        listener: QueueListener,
        check: Callable[[Any], None] | None = None,
        driver: Callable[[Connection[Any], Batch], Results] = execute,
    ) -> None:
        self._pool, self._listener, self._check, self._execute = pool, listener, check, driver
        self.conn: Connection[Any] | None = conn

    def execute(self, batch: Batch) -> Results:
        if batch.wait is not None:
            if self.conn is not None:
                conn, self.conn = self.conn, None
                self._pool.putconn(conn)
            channel, seconds = batch.wait
            self._listener.wait(channel, batch.ticket, seconds)
            return []
        if self.conn is None:
            self.conn = self._pool.getconn()
            if self._check is not None:
                self._check(self.conn)
        return self._execute(self.conn, batch)

    def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            self._pool.putconn(conn)


class ACheckout:
    """:class:`Checkout` for an async pool."""

    __slots__ = ("_check", "_execute", "_listener", "_pool", "conn")

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        conn: AsyncConnection[Any],
        listener: QueueListener,
        check: Callable[[Any], None] | None = None,
        driver: Callable[[AsyncConnection[Any], Batch], Awaitable[Results]] = aexecute,
    ) -> None:
        self._pool, self._listener, self._check, self._execute = pool, listener, check, driver
        self.conn: AsyncConnection[Any] | None = conn

    async def execute(self, batch: Batch) -> Results:
        if batch.wait is not None:
            if self.conn is not None:
                conn, self.conn = self.conn, None
                await self._pool.putconn(conn)
            channel, seconds = batch.wait
            await self._listener.await_(channel, batch.ticket, seconds)
            return []
        if self.conn is None:
            self.conn = await self._pool.getconn()
            if self._check is not None:
                self._check(self.conn)
        return await self._execute(self.conn, batch)

    async def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            await self._pool.putconn(conn)
