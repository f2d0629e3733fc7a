"""psycopg_pool's pools, handing out the most recently returned connection first.

psycopg_pool hands out the connection that has been idle longest: even one graph run at
a time then visits every connection of the pool in turn, and each call finds its Postgres
backend's (and its psycopg connection's) caches cold. Handing out the most recently
returned one instead keeps a quiet workload on a few warm connections; under load every
connection is busy either way, and the ones left idle are the ones psycopg_pool's
``max_idle`` closes. PgBouncer reuses its server connections in this order by default.

Measured (``benchmarks/bench_graph.py --pool-order newest``), one graph run at a time
over a pool of 10: the server's CPU per run fell by 5-35% for DeterministicSaver and for
langgraph's PostgresSaver alike; wall time per run moved within the benchmark's noise in
one benchmark and fell 24% (ours) and 5% (the peer) in another.

``DeterministicSaver(dsn)`` builds its own pools with these classes. For a pool of your
own, use them in place of psycopg_pool's: same constructor, same behaviour otherwise::

    from langgraph_deterministic.pool import AsyncConnectionPool
    pool = AsyncConnectionPool(dsn, max_size=10, kwargs={"autocommit": True, ...})

The order is psycopg_pool's internal state (its deque of idle connections, taken from the
left): if a release of psycopg_pool changes that, these classes hand out connections in
psycopg_pool's own order, which is correct, only slower.
"""

from __future__ import annotations

import psycopg_pool
from psycopg_pool.abc import ACT, CT

from langgraph_deterministic._compat.psycopg_pool import AsyncNewestFirst, NewestFirst

__all__ = ["AsyncConnectionPool", "ConnectionPool"]


# The order is chosen through psycopg_pool's private hook and deque: the mixins of
# _compat.psycopg_pool, the one home of the private names we rely on.
class ConnectionPool(NewestFirst, psycopg_pool.ConnectionPool[CT]):
    """psycopg_pool.ConnectionPool, handing out its most recently returned connection."""


class AsyncConnectionPool(AsyncNewestFirst, psycopg_pool.AsyncConnectionPool[ACT]):
    """psycopg_pool.AsyncConnectionPool, handing out its most recently returned
    connection."""
