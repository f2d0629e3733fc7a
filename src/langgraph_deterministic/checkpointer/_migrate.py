"""Schema migrations, sans-I/O: numbered ``.sql`` files applied in order, once each.

Files live in ``langgraph_deterministic/migrations`` and are named
``NNNN_<phase>_<what>.sql``. Phase ``pre`` is safe while older code still runs (new tables,
columns with defaults, indexes built CONCURRENTLY); ``post`` steps (dropping what old code
still reads) run only once every worker is upgraded. ``setup()`` applies both; the CLI can
apply one phase at a time for a rolling deploy.

A file whose first line is ``-- lgd:no-transaction`` runs statement by statement outside a
transaction (CREATE INDEX CONCURRENTLY needs that); any other file runs in one transaction
with a short lock_timeout, so a migration waits behind a long query briefly and fails
cleanly instead of queueing every checkpoint write behind its lock.

Our versions are kept in our own table; the peer's ``checkpoint_migrations`` is only ever
filled in, never rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

from langgraph_deterministic.checkpointer._core import Batch, Operation, Statement
from langgraph_deterministic.errors import ConfigurationError

Phase = Literal["pre", "post", "all"]

VERSION_TABLE = "langgraph_deterministic_migrations"
# Session-level advisory lock: several processes calling setup() at once take turns.
# It is polled with pg_try_advisory_lock, never waited for inside a statement: CREATE
# INDEX CONCURRENTLY waits for every open transaction to end, and a session blocked in
# pg_advisory_lock() is one, held open by the very session building the index: a deadlock.
ADVISORY_LOCK_KEY = 0x6C67645F6D6967  # "lgd_mig"
TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s)"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%s)"
LOCK_POLL_SQL = "SELECT pg_sleep(0.05)"
LOCK_WAIT_POLLS = 6000  # 5 minutes
LOCK_TIMEOUT = "5s"

_NAME = re.compile(r"^(\d{4})_(pre|post)_([a-z0-9_]+)\.sql$")
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    phase: Literal["pre", "post"]
    name: str
    sql: str

    @property
    def transactional(self) -> bool:
        return not self.sql.lstrip().startswith("-- lgd:no-transaction")

    def statements(self) -> list[str]:
        """Split a no-transaction file on ';' at line ends. Such files hold only plain
        DDL (no function bodies), which keeps this split trivially correct."""
        body = "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        )
        return [s.strip() for s in re.split(r";\s*$", body, flags=re.MULTILINE) if s.strip()]

    def concurrent_indexes(self) -> list[str]:
        return _CONCURRENT_INDEX.findall(self.sql)


@cache
def discover() -> tuple[Migration, ...]:
    found = []
    for entry in resources.files("langgraph_deterministic.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match is None:
            continue
        version, phase, name = match.groups()
        found.append(Migration(int(version), phase, name, entry.read_text("utf-8")))  # type: ignore[arg-type]
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration numbers in {versions}")  # a packaging bug
    return tuple(found)


def latest_version() -> int:
    return discover()[-1].version


def _single(
    sql: str, params: Sequence[object] | None = None, fetch: bool = False
) -> Batch:
    return Batch((Statement(sql, params, fetch=fetch, prepare=False),), pipeline=False)


def applied_versions() -> Operation[set[int]]:
    (exists,) = yield _single("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,), fetch=True)
    if not exists or not exists[0][0]:
        return set()
    (rows,) = yield _single(f"SELECT version FROM {VERSION_TABLE}", fetch=True)
    return {r[0] for r in rows or ()}


def migrate(phase: Phase = "all") -> Operation[list[Migration]]:
    """Apply the pending migrations of ``phase``; return those applied.

    The saver holds the advisory lock around this operation (see ``TRY_LOCK_SQL``).
    """
    if phase not in ("pre", "post", "all"):
        raise ConfigurationError(f"Unknown migration phase {phase!r}; use 'pre', 'post' or 'all'.")
    yield _single(
        f"""CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
            version INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            phase TEXT NOT NULL,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )"""
    )
    done = yield from applied_versions()
    pending = [m for m in discover() if m.version not in done]
    if phase == "post" and any(m.phase == "pre" for m in pending):
        raise ConfigurationError(
            "Post-deploy migrations need every pre-deploy migration applied first; "
            "run `langgraph-deterministic migrate --phase pre` (or setup()) before."
        )
    applied = []
    for migration in pending:
        if phase != "all" and migration.phase != phase:
            continue
        record = Statement(
            f"INSERT INTO {VERSION_TABLE} (version, name, phase) VALUES (%s, %s, %s)",
            (migration.version, migration.name, migration.phase),
            prepare=False,
        )
        if migration.transactional:
            yield Batch(
                (
                    Statement(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'", prepare=False),
                    Statement(migration.sql, prepare=False),
                    record,
                ),
                atomic=True,
                pipeline=False,
            )
        else:
            for index in migration.concurrent_indexes():
                # A CONCURRENTLY build that was interrupted leaves an INVALID index that
                # IF NOT EXISTS would skip forever. Drop it so the build is redone.
                (invalid,) = yield _single(
                    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE c.relname = %s AND NOT i.indisvalid",
                    (index,),
                    fetch=True,
                )
                if invalid:
                    yield _single(f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"')
            for statement in migration.statements():
                yield _single(statement)
            yield Batch((record,), atomic=True, pipeline=False)
        applied.append(migration)
    return applied
