"""Schema migrations, sans-I/O: numbered ``.sql`` files applied in order, once each.

Files live in ``langgraph_deterministic/migrations`` and are named
``NNNN_<phase>_<what>.sql``. Phase ``pre`` is safe while older code still runs (new tables,
columns with defaults, indexes built CONCURRENTLY, functions under new versioned names);
``post`` steps (dropping what old code still reads) run only once every worker is
upgraded. ``setup()`` applies both; the CLI can apply one phase at a time for a rolling
deploy.

A file whose first line is ``-- lgd:no-transaction`` runs statement by statement outside a
transaction (CREATE INDEX CONCURRENTLY needs that); any other file runs in one transaction.

Online by default, beside live workers:

* nothing is done that the catalog says is done already: an index that exists (valid) is
  not built again, and the files themselves read the catalog before any ALTER (an
  ``ALTER TABLE ... IF NOT EXISTS`` takes its ACCESS EXCLUSIVE lock even when it then
  does nothing, and every query on the table queues behind it while it waits);
* every statement runs under a short ``lock_timeout`` (:class:`LockPolicy`): a DDL
  statement waiting for its lock stalls the queries queued behind it for at most that
  long, then gives up, pauses (doubling backoff, no lock held but the advisory one) and
  tries again, a bounded number of times, then raises
  :class:`~langgraph_deterministic.errors.MigrationLockTimeoutError` naming the oldest
  open transactions;
* a failed or cancelled step is rolled back (or, for a CONCURRENTLY build, its INVALID
  leftover is dropped by the next run) and the advisory lock is released; running the
  migration again completes it.

Our versions are kept in our own table; the peer's ``checkpoint_migrations`` is only ever
filled in, never rewritten.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

import psycopg.errors

from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic.errors import (
    ConfigurationError,
    MigrationError,
    MigrationLockTimeoutError,
)

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
# The session's lock_timeout is set for the migration and put back afterwards.
GET_LOCK_TIMEOUT_SQL = "SELECT current_setting('lock_timeout')"
SET_LOCK_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s, false)"
# The oldest open transactions of this database: whoever is likely to hold the lock.
BLOCKERS_SQL = """
SELECT a.pid, coalesce(a.state, '?'), extract(epoch FROM now() - a.xact_start)::int,
       left(regexp_replace(coalesce(a.query, ''), '[[:space:]]+', ' ', 'g'), 80)
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.xact_start IS NOT NULL
ORDER BY a.xact_start LIMIT 5
"""
_NAME = re.compile(r"^(\d{4})_(pre|post)_([a-z0-9_]+)\.sql$")
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE
)
_INDEX_STATE_SQL = (
    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE c.relname = %s AND pg_table_is_visible(c.oid)"
)


DEFAULT_LOCK_TIMEOUT = 0.2
DEFAULT_LOCK_RETRIES = 10


@dataclass(frozen=True, slots=True)
class LockPolicy:
    """How long a migration statement may wait for its lock, and how often it retries.

    With the defaults a statement queued behind an open transaction holds up the
    queries queued behind it for at most 200 ms at a time, and the migration gives up
    after about 20 s in all."""

    timeout: float = DEFAULT_LOCK_TIMEOUT  # seconds: lock_timeout of every statement
    retries: int = DEFAULT_LOCK_RETRIES  # attempts after the first
    backoff: float = 0.1  # first pause, doubled after each failed attempt
    max_backoff: float = 3.0

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0:
            raise ConfigurationError(
                "lock_timeout must be > 0 seconds and lock_retries >= 0 "
                f"(got {self.timeout!r} and {self.retries!r})."
            )

    @property
    def timeout_setting(self) -> str:
        return f"{max(1, round(self.timeout * 1000))}ms"

    def pauses(self) -> Iterator[float]:
        pause = self.backoff
        for _ in range(self.retries):
            # Jitter: processes that failed together do not retry in lockstep.
            yield round(pause * random.uniform(0.8, 1.2), 3)
            pause = min(self.max_backoff, pause * 2)


StepAction = Literal["applied", "skipped", "would run", "would skip"]


@dataclass(frozen=True, slots=True)
class StepReport:
    """One step of a migration as it ran (or, in a dry run, would run)."""

    migration: Migration
    sql: str
    action: StepAction
    seconds: float = 0.0
    attempts: int = 1
    reason: str = ""


Progress = Callable[[StepReport], None]


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


_VERSION_TABLE_SQL = f"""CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    phase TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""


def label(migration: Migration) -> str:
    return f"{migration.version:04d}_{migration.phase}_{migration.name}"


def migrate(
    phase: Phase = "all",
    *,
    policy: LockPolicy = LockPolicy(),
    dry_run: bool = False,
    progress: Progress | None = None,
) -> Operation[list[Migration]]:
    """Apply the pending migrations of ``phase``; return those applied (in a dry run:
    those that would be, with every statement reported to ``progress`` and nothing
    written).

    The saver holds the advisory lock and sets the session's lock_timeout around this
    operation (see ``saver._locked``).
    """
    if phase not in ("pre", "post", "all"):
        raise ConfigurationError(f"Unknown migration phase {phase!r}; use 'pre', 'post' or 'all'.")
    report = progress or (lambda _: None)
    done = yield from applied_versions()
    pending = [m for m in discover() if m.version not in done]
    if phase == "post" and any(m.phase == "pre" for m in pending):
        raise ConfigurationError(
            "Post-deploy migrations need every pre-deploy migration applied first; "
            "run `langgraph-deterministic migrate --phase pre` (or setup()) before."
        )
    selected = [m for m in pending if phase == "all" or m.phase == phase]
    if not selected:
        return []
    if not done:
        (exists,) = yield _single(
            "SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,), fetch=True
        )
        if not (exists and exists[0][0]) and not dry_run:
            yield from _retrying(_single(_VERSION_TABLE_SQL), policy, selected[0],
                                 _VERSION_TABLE_SQL)  # fmt: skip
    for migration in selected:
        if dry_run:
            yield from _plan(migration, report)
        elif migration.transactional:
            yield from _apply_file(migration, policy, report)
        else:
            yield from _apply_statements(migration, policy, report)
    return selected


def _record(migration: Migration) -> Statement:
    return Statement(
        f"INSERT INTO {VERSION_TABLE} (version, name, phase) VALUES (%s, %s, %s)",
        (migration.version, migration.name, migration.phase),
        prepare=False,
    )


def _plan(migration: Migration, report: Progress) -> Operation[None]:
    if migration.transactional:
        report(StepReport(migration, migration.sql.strip(), "would run"))
        return
    for statement in migration.statements():
        index = _index_name(statement)
        state = (yield from _index_state(index)) if index else None
        if state is True:
            report(StepReport(migration, statement, "would skip", reason=f"index {index} exists"))
            continue
        if state is False:
            report(StepReport(migration, _drop_index_sql(index or ""), "would run",
                              reason=f"index {index} is INVALID (an interrupted build)"))  # fmt: skip
        report(StepReport(migration, statement, "would run"))


def _apply_file(migration: Migration, policy: LockPolicy, report: Progress) -> Operation[None]:
    t0 = time.perf_counter()
    batch = Batch(
        (
            Statement(f"SET LOCAL lock_timeout = '{policy.timeout_setting}'", prepare=False),
            Statement(migration.sql, prepare=False),
            _record(migration),
        ),
        atomic=True,
        pipeline=False,
    )
    attempts = yield from _retrying(batch, policy, migration, migration.sql)
    report(StepReport(migration, migration.sql.strip(), "applied",
                      time.perf_counter() - t0, attempts))  # fmt: skip


def _apply_statements(
    migration: Migration, policy: LockPolicy, report: Progress
) -> Operation[None]:
    for statement in migration.statements():
        t0 = time.perf_counter()
        index = _index_name(statement)
        if index and (yield from _index_state(index)) is True:
            report(StepReport(migration, statement, "skipped", reason=f"index {index} exists"))
            continue
        attempts = yield from _retrying(
            _statement_step(statement, index), policy, migration, statement, index
        )
        report(StepReport(migration, statement, "applied", time.perf_counter() - t0, attempts))
    record = _record(migration)
    yield from _retrying(Batch((record,), atomic=True, pipeline=False), policy, migration,
                         record.sql)  # fmt: skip


def _statement_step(statement: str, index: str | None) -> Callable[[], Operation[None]]:
    """One attempt at a statement of a migration split into statements."""

    def attempt() -> Operation[None]:
        if index and (yield from _index_state(index)) is False:
            # A CONCURRENTLY build that was interrupted (or timed out on its lock) leaves
            # an INVALID index that IF NOT EXISTS would skip forever: drop it so the build
            # is redone.
            yield _single(_drop_index_sql(index))
        yield _single(statement)

    return attempt


def _retrying(
    step: Batch | Callable[[], Operation[None]],
    policy: LockPolicy,
    migration: Migration,
    what: str,
    index: str | None = None,
) -> Operation[int]:
    """Run ``step`` (a batch, or an operation made afresh per attempt); on a lock timeout
    pause and run it again. Returns the attempts."""
    for attempts, pause in enumerate([*policy.pauses(), None], 1):
        try:
            if isinstance(step, Batch):
                yield step
            else:
                yield from step()
            return attempts
        except psycopg.errors.LockNotAvailable as exc:
            if pause is None:
                yield from _give_up(migration, what, policy, attempts, exc, index)
        except (psycopg.errors.QueryCanceled, psycopg.errors.InsufficientPrivilege) as exc:
            raise _step_failed(migration, what, exc) from exc
        try:  # (a cancel during the pause is the step's too)
            yield _single(f"SELECT pg_sleep({pause})")
        except psycopg.errors.QueryCanceled as exc:
            raise _step_failed(migration, what, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _give_up(
    migration: Migration,
    sql: str,
    policy: LockPolicy,
    attempts: int,
    exc: BaseException,
    index: str | None,
) -> Operation[None]:
    leftover = ""
    if index:
        try:  # best effort: leave no INVALID index behind (the next run drops it too)
            if (yield from _index_state(index)) is False:
                yield _single(_drop_index_sql(index))
        except psycopg.errors.LockNotAvailable:
            leftover = (
                f" An INVALID index {index} from the attempt is left behind; the next "
                "run drops and rebuilds it."
            )
    (rows,) = yield _single(BLOCKERS_SQL, fetch=True)
    blockers = "; ".join(
        f"pid {pid} ({state}, transaction open {age} s: {query or '-'})"
        for pid, state, age, query in rows or ()
    ) or "none now (they have ended since)"
    first_line = " ".join(sql.split())[:100]
    raise MigrationLockTimeoutError(
        f"Migration {label(migration)} could not get the lock it needs for `{first_line}` "
        f"within lock_timeout {policy.timeout_setting}, {attempts} times: other sessions keep "
        f"transactions open on the table. Oldest open transactions: {blockers}. Workers "
        f"were held up at most {policy.timeout_setting} at a time; this step was rolled "
        f"back and the migrations before it stay applied.{leftover} Fix: end or wait out "
        "those transactions (an idle-in-transaction session, a pg_dump, a long report), "
        "then run `langgraph-deterministic migrate` (or setup()) again; or allow longer "
        "waits with --lock-timeout / --lock-retries (setup(lock_timeout=..., "
        "lock_retries=...))."
    ) from exc


#: How a step can fail besides its lock timeout: (what happened, what it means and the fix)
_STEP_FAILURES: dict[type[psycopg.Error], tuple[str, str]] = {
    psycopg.errors.QueryCanceled: (
        "was cancelled during",
        "The step was rolled back (an index being built CONCURRENTLY is dropped and rebuilt "
        "by the next run) and the advisory lock released. Fix: run `langgraph-deterministic "
        "migrate` (or setup()) again; if a statement_timeout cancelled it, run it on a "
        "connection without one.",
    ),
    psycopg.errors.InsufficientPrivilege: (
        "is not permitted to",
        "Altering or indexing the checkpoint tables takes their owner (Postgres has no "
        "grant for it), and creating ours takes CREATE on the schema. This statement was "
        "rolled back; what ran before it stays applied. Fix: run `langgraph-deterministic "
        "migrate` (or setup()) as the role that owns the tables (the one that ran "
        "PostgresSaver.setup(), when adopting), then let workers connect as their usual "
        "role.",
    ),
}


def _step_failed(migration: Migration, sql: str, exc: psycopg.Error) -> MigrationError:
    failed, then = next(v for kind, v in _STEP_FAILURES.items() if isinstance(exc, kind))
    first_line = " ".join(sql.split())[:100]
    return MigrationError(
        f"Migration {label(migration)} {failed} `{first_line}` ({str(exc).strip()}). {then}"
    )


def _index_name(statement: str) -> str | None:
    found = _CONCURRENT_INDEX.search(statement)
    return found.group(1) if found else None


def _drop_index_sql(index: str) -> str:
    return f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"'


def _index_state(index: str) -> Operation[bool | None]:
    """True: a valid index of that name exists; False: an INVALID one; None: none."""
    (rows,) = yield _single(_INDEX_STATE_SQL, (index,), fetch=True)
    return bool(rows[0][0]) if rows else None


# --- the advisory lock around the migrations ---------------------------------------

# A pooler (PgBouncer, RDS Proxy, Supavisor) answers the startup with a backend pid of its
# own: a pid the server does not confirm means the connection is not direct.
BACKEND_PID_SQL = "SELECT pg_backend_pid()"


def direct_only(
    phase: Phase, client_pid: int, locked: Operation[list[str]]
) -> Operation[list[str]]:
    """Run ``locked`` (the migrations under the advisory lock) on a direct connection only.

    The lock is per session. Behind a transaction-pooling proxy (PgBouncer, RDS Proxy,
    Supavisor) consecutive statements of one client run on different server sessions: the
    lock would be taken on one, left there for another client to inherit (which would then
    migrate concurrently), and never released. Such a proxy answers the startup with a
    backend pid of its own, so a pid the server does not confirm means "not direct". Then
    setup only checks that nothing is pending, and otherwise refuses before any lock.
    """
    (rows,) = yield _single(BACKEND_PID_SQL, fetch=True)
    if rows and rows[0][0] == client_pid:
        return (yield from locked)
    locked.close()  # never started: it took no lock
    if phase not in ("pre", "post", "all"):
        raise ConfigurationError(f"Unknown migration phase {phase!r}; use 'pre', 'post' or 'all'.")
    done = yield from applied_versions()
    pending = [
        label(m)
        for m in discover()
        if m.version not in done and phase in ("all", m.phase)
    ]
    if not pending:
        return []
    raise ConfigurationError(
        "setup() cannot migrate through a connection pooler (PgBouncer, RDS Proxy, "
        "Supavisor...): this connection's backend pid is not the server's, and migrations "
        "hold a session-level lock that transaction pooling would leave on a server "
        f"connection other clients reuse. Pending: {', '.join(pending)}. Run the migrations "
        "once over a direct connection to Postgres (e.g. `langgraph-deterministic migrate "
        "--dsn <direct DSN>`, or DeterministicSaver(direct_dsn).setup()); then setup() "
        "through the pooler succeeds. Nothing was changed."
    )


def named(operation: Operation[list[Migration]]) -> Operation[list[str]]:
    return [label(m) for m in (yield from operation)]


def locked(
    operation: Operation[list[Migration]], policy: LockPolicy
) -> Operation[list[str]]:
    """Hold the migrations' advisory lock, with the session's lock_timeout set to the
    policy's, around ``operation``. Both are per session, so both are put back on the
    same connection however the operation ends: an error, a cancelled task, Ctrl-C (the
    driver throws those in here too). A pooled connection goes back to its pool as it
    came; a session that died (pg_terminate_backend, a lost network) took both with it."""
    key = (ADVISORY_LOCK_KEY,)

    def single(sql: str, params: Sequence[object] | None = None) -> Batch:
        return _single(sql, params, fetch=True)

    (saved,) = yield single(GET_LOCK_TIMEOUT_SQL)
    previous = saved[0][0] if saved else "0"
    for _ in range(LOCK_WAIT_POLLS):
        (rows,) = yield single(TRY_LOCK_SQL, key)
        if rows and rows[0][0]:
            break
        yield single(LOCK_POLL_SQL)
    else:
        raise ConfigurationError(
            "Another process has been applying migrations for 5 minutes (it holds the "
            "advisory lock). Wait for it, or look for a stuck `langgraph-deterministic "
            "migrate` / setup() in pg_stat_activity."
        )
    release = single(
        "SELECT set_config('lock_timeout', %s, false), pg_advisory_unlock(%s)",
        (previous, *key),
    )
    try:
        yield single(SET_LOCK_TIMEOUT_SQL, (policy.timeout_setting,))
        applied = yield from operation
    except GeneratorExit:
        raise
    except BaseException:
        with suppress(Exception):  # if the session is gone, its lock went with it
            yield release
        raise
    yield release
    return [label(m) for m in applied]
