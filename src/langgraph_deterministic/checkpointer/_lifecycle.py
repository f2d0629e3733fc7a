"""The lifecycle of a DeterministicSaver: ``with`` / ``async with``, ``close()`` and
``aclose()``, and the async pool a DSN saver creates, closed with its event loop (also
when the saver is never closed) or from another thread than that loop's.

:class:`Lifecycle` is a mixin of :class:`~.saver.DeterministicSaver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_deterministic.checkpointer._leases import LeaseKeeper
from langgraph_deterministic.checkpointer._waiting import QueueListener
from langgraph_deterministic.checkpointer._writebuffer import WriteBuffer
from langgraph_deterministic.errors import ConfigurationError


class Lifecycle:
    """Entering and closing a saver; the connection state it reads is set up by
    :class:`~._connections.Connections`."""

    _leases: LeaseKeeper
    _listener: QueueListener | None
    _writes: WriteBuffer | None
    _dsn: str | None
    _pool: ConnectionPool[Any] | None
    _apool: AsyncConnectionPool[Any] | None
    _apool_guard: AsyncGenerator[None, None] | None
    _apool_loop: asyncio.AbstractEventLoop | None
    _owns_pools: bool
    _closed: bool

    if TYPE_CHECKING:  # provided by Connections

        def _refuse_if_closed(self) -> None: ...
        def _sync_pool(self) -> ConnectionPool[Any] | None: ...
        async def _async_pool(self) -> AsyncConnectionPool[Any] | None: ...

    def __enter__(self) -> Self:
        self._refuse_if_closed()
        if self._dsn is not None:
            self._sync_pool()  # a wrong DSN fails here, with the server's own reason
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
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
        if self._listener is not None:
            self._listener.close()
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
        if self._listener is not None:
            self._listener.close()
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
