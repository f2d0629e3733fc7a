"""Crossing between threads and event loops: the sync API over an async connection (run
on its loop from another thread), the sync-on-loop refusal, and waiting for a future of
one loop from a thread or from another coroutine.

Whether a call is made on an event loop's thread is read from ``asyncio`` itself
(:func:`running_loop`); nothing here inspects the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Self, TypeVar

from langgraph_deterministic.errors import ConfigurationError

T = TypeVar("T")


class SyncCallOnLoopError(ConfigurationError, asyncio.InvalidStateError):
    """A sync method over an async connection, called from its event loop. Also an
    ``asyncio.InvalidStateError``, which AsyncPostgresSaver raises in that case."""


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or None (a plain thread, or sync code)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_on_loop(
    loop: asyncio.AbstractEventLoop | None, call: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """The sync API over an async connection: allowed from a thread other than the
    event loop's (e.g. a sync node run by LangGraph's executor)."""
    if loop is None or running_loop() is loop or not loop.is_running():
        raise SyncCallOnLoopError(
            "This saver was given an async connection, so its sync methods work only "
            "from another thread while its event loop runs. Use the async API "
            "(graph.ainvoke/astream) or give the saver a DSN, a Connection or a "
            "ConnectionPool."
        )
    return asyncio.run_coroutine_threadsafe(call(), loop).result()


def sync_on_loop_error(name: str, async_name: str) -> SyncCallOnLoopError:
    """The refusal of the sync method ``name`` called on an event loop's thread, of a
    saver with only an async connection: it could only block the loop it needs."""
    return SyncCallOnLoopError(
        f"saver.{name}() is the sync method, called on an event loop's thread, and this "
        f"saver has only an async connection. Use `await saver.{async_name}()` in async "
        "code. Nothing was run."
    )


class AwaitableList(list[T]):
    """A sync method's result when it was called on an event loop's thread: a plain list,
    which ``await`` also accepts (it gives the list back), so the peer's
    ``await saver.setup()`` (AsyncPostgresSaver's setup is a coroutine) works as well as
    a plain call. The work is done by the call, on the loop's thread."""

    def __await__(self) -> Generator[Any, None, Self]:
        yield from ()
        return self


async def wait_shielded(waiter: asyncio.Future[None]) -> None:
    await asyncio.shield(waiter)  # a cancelled put must not cancel the store it waits for


def wait_from_thread(waiter: asyncio.Future[None]) -> None:
    """Wait, from a thread, for a future of an async run's loop."""
    asyncio.run_coroutine_threadsafe(wait_shielded(waiter), waiter.get_loop()).result()
