"""psycopg_pool's private names: the counters behind a pool's ``get_stats()``, and the
hook and the deque through which ``langgraph_deterministic.pool`` hands out the most
recently returned connection first.

The saver checks a connection out with ``getconn()`` / ``putconn()`` rather than
``pool.connection()`` (see ``DeterministicSaver._run``), so it adds what ``connection()``
would add to ``usage_ms`` itself. Where a release keeps its counters elsewhere, nothing
is counted: the statistic reads low, nothing else changes (``tests/compat`` notices).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from psycopg_pool.base import BasePool

#: The key of ``usage_ms`` in the pool's private ``_stats`` counter.
USAGE_MS: str | None = getattr(BasePool, "_USAGE_MS", None)


def count_usage(pool: Any, t0: float) -> None:
    """Add a checkout's time (``time.monotonic()`` at ``getconn``) to the pool's
    ``usage_ms`` statistic, as its ``connection()`` does (whole milliseconds per
    checkout, the putconn included)."""
    stats = getattr(pool, "_stats", None)
    if stats is not None and USAGE_MS is not None:
        stats[USAGE_MS] += int(1000.0 * (time.monotonic() - t0))


# psycopg_pool takes an idle connection in ``_get_ready_connection`` (under the pool's
# lock), from the left of its deque ``_pool``, and returns them on the right. There is no
# public way to choose which idle connection a checkout gets, so the pools of
# ``langgraph_deterministic.pool`` override that hook: both names live here, the one home
# of the wrapped libraries' private names. Where a release renames them, the pools hand
# out connections in psycopg_pool's own order (correct, only slower; tests/compat and
# tests/checkpointer/test_pool.py notice).


def newest_first(pool: Any) -> None:
    """Put the most recently returned idle connection where psycopg_pool takes from."""
    idle = getattr(pool, "_pool", None)
    if isinstance(idle, deque) and len(idle) > 1:
        idle.rotate(1)  # returned ones are appended on the right, taken from the left


class NewestFirst:
    """Mixin, before psycopg_pool.ConnectionPool: its checkouts take the newest idle
    connection."""

    def _get_ready_connection(self, timeout: float | None) -> Any:
        newest_first(self)  # under the pool's lock, as the take itself
        return super()._get_ready_connection(timeout)  # type: ignore[misc]


class AsyncNewestFirst:
    """Mixin, before psycopg_pool.AsyncConnectionPool: as :class:`NewestFirst`."""

    async def _get_ready_connection(self, timeout: float | None) -> Any:
        newest_first(self)
        return await super()._get_ready_connection(timeout)  # type: ignore[misc]
