"""psycopg_pool's private names: the counters behind a pool's ``get_stats()``.

The saver checks a connection out with ``getconn()`` / ``putconn()`` rather than
``pool.connection()`` (see ``DeterministicSaver._run``), so it adds what ``connection()``
would add to ``usage_ms`` itself. Where a release keeps its counters elsewhere, nothing
is counted: the statistic reads low, nothing else changes (``tests/compat`` notices).
"""

from __future__ import annotations

import time
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
