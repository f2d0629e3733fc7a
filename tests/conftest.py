"""Shared Postgres fixtures for every test module.

``pg_server_dsn`` (session): ``$DATABASE_URL`` when set, else an embedded Postgres
(devtools/postgres.py: pgserver, else the machine's binaries) started on first use and
stopped at the end of the session. ``dsn`` (module): a fresh, empty database on that server
for each test module, dropped when the module ends.

``pgbouncer`` (session): a real PgBouncer in transaction pooling mode in front of that
server (tests/pgbouncer.py); ``bouncer.dsn_for(dsn)`` reaches a database through it. It
skips with the reason when pgbouncer is not installed, unless LGD_REQUIRE_PGBOUNCER=1 (CI),
where that is a failure.

Nothing here is autouse: a test session that never asks for these fixtures never starts
Postgres. Other conftest files can build more databases with :func:`make_database` (or
``devtools.postgres.create_database`` / ``drop_database``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from devtools.postgres import (
    create_database,
    database_name,
    drop_database,
    ensure_database_url,
)

if TYPE_CHECKING:
    from tests.pgbouncer import PgBouncer


def make_database(admin_dsn: str, prefix: str = "lgd_test") -> str:
    """Create a new empty database on ``admin_dsn``'s server; return a DSN for it.

    The caller drops it with ``drop_database(admin_dsn, database_name(dsn))``.
    """
    return create_database(admin_dsn, prefix=prefix)


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """Admin DSN of the session's Postgres: $DATABASE_URL, or an embedded server."""
    url, server = ensure_database_url()
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


@pytest.fixture(scope="module")
def dsn(pg_server_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """DSN of a database created empty for this test module and dropped after it."""
    module = getattr(request.module, "__name__", "module").rpartition(".")[2]
    fresh = make_database(pg_server_dsn, prefix=f"lgd_{module}")
    try:
        yield fresh
    finally:
        drop_database(pg_server_dsn, database_name(fresh))


@pytest.fixture(scope="session")
def pgbouncer(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """A PgBouncer (transaction pooling) in front of the session's Postgres."""
    from tests.pgbouncer import PgBouncer, PgBouncerUnavailable  # only for tests that ask

    try:
        bouncer = PgBouncer(pg_server_dsn).start()
    except PgBouncerUnavailable as exc:
        if os.environ.get("LGD_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(f"LGD_REQUIRE_PGBOUNCER=1 but pgbouncer is unavailable: {exc}")
        pytest.skip(f"pgbouncer unavailable: {exc}")
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    """This module's fresh database with every migration applied (modules that need more,
    the peer's tables say, define their own)."""
    from langgraph_deterministic.checkpointer import DeterministicSaver

    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn
