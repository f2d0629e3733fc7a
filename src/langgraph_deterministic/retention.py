"""Retention: sweep threads past their TTL (``saver.sweep``, ``langgraph-deterministic prune``).

What is old: a thread's **last write** is the newest of

* the time in its greatest checkpoint id, over every namespace (LangGraph makes each
  checkpoint id a uuid6 from the clock at the write; an id that is not a uuid6 falls back
  to that checkpoint's ``checkpoint["ts"]``), and
* with our tables, its run ledger's ``updated_at`` (``lgd_runs``) and its journal's
  claims and completions (``lgd_journal``).

So a database only langgraph's PostgresSaver wrote (no timestamp column anywhere) ages the
same way. A thread expires when its last write is older than its TTL: the policy's
``default_ttl``, or the per-thread override ``metadata["retention_ttl_minutes"]`` of its latest
root checkpoint (a number of minutes, or ``"never"``), which a run sets through its config
(``config["metadata"]``) as any checkpoint metadata.

Each expired thread is swept in its own transaction (``lgd_sweep_claim_v1``, migration
0026): the thread's lease row is taken as a run's admission takes it, then what the scan
saw is checked again; a thread with a live lease, a queued run, a write since the scan or
an interrupt awaiting its resume (unless ``expire_interrupted``) is left as it is and
reported. ``delete`` removes the thread whole (checkpoints, blobs, writes, chain, ledger,
lease, queue, journal, repair log and the repair backups ``lgd-backup:*``);
``keep_latest`` keeps each namespace's latest checkpoint and what it needs (saver.prune's
keep_latest), and leaves a thread with a DeltaChannel whole (reported ``delta``). Every
run whose checkpoints go leaves a tombstone (``lgd_swept_runs``), kept for
``tombstone_ttl``: a retry of it raises :class:`~langgraph_deterministic.RunSweptError`.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.errors import ConfigurationError, SchemaNotReadyError


class SweepingSaver(Protocol):
    """What a :class:`Sweeper` needs of its saver (``DeterministicSaver`` is one): named here
    so that this module, which the saver imports, does not import the saver back."""

    def sweep(self, policy: RetentionPolicy, *, apply: bool) -> SweepReport: ...

    async def asweep(self, policy: RetentionPolicy, *, apply: bool) -> SweepReport: ...

Strategy = Literal["delete", "keep_latest"]
STRATEGIES: tuple[str, ...] = ("delete", "keep_latest")
#: The per-thread override, in the latest root checkpoint's metadata: minutes, or "never".
TTL_KEY = "retention_ttl_minutes"
#: Why a thread past its TTL was left as it is.
SKIP_REASONS: Mapping[str, str] = {
    "leased": "a live lease: a run in flight",
    "queued": "a run waits for the thread (enqueue)",
    "written": "written since the scan (a run won the race)",
    "interrupted": "an interrupt awaits its resume (expire_interrupted is off)",
    "delta": "a LangGraph.js DeltaChannel thread: keep_latest keeps it whole (use delete)",
    "busy": "a lock not granted within lock_timeout: the next sweep tries again",
}
#: Longer than any orchestrator's retry window we know of (Temporal's namespace
#: retention caps at 90 days, Celery's visibility timeout is hours).
DEFAULT_TOMBSTONE_TTL = _dt.timedelta(days=400)
_UUID6_EPOCH = 0x01B21DD213814000  # 100 ns ticks from 1582-10-15 to 1970-01-01


def parse_duration(text: str) -> _dt.timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or ``2w`` as a timedelta."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip()
    if len(t) > 1 and t[-1] in units and t[:-1].isdigit():
        return _dt.timedelta(seconds=int(t[:-1]) * units[t[-1]])
    raise ConfigurationError(
        f"{text!r} is not a duration. Fix: a whole number and a unit, e.g. 30d, 12h, 90m, 2w."
    )


@dataclass(frozen=True)
class RetentionPolicy:
    """What a sweep removes (LangGraph Platform's ``checkpointer.ttl``, one to one:
    ``strategy`` is its ``strategy``, ``default_ttl`` its ``default_ttl`` in minutes, and
    :class:`Sweeper`'s ``interval`` its ``sweep_interval_minutes``)."""

    default_ttl: _dt.timedelta | None
    """How long after its last write a thread expires; None: only threads with a
    per-thread override (``metadata["retention_ttl_minutes"]``) expire."""
    strategy: Strategy = "delete"
    expire_interrupted: bool = False
    """Whether a thread stopped at an interrupt (awaiting its resume) expires too."""
    tombstone_ttl: _dt.timedelta = DEFAULT_TOMBSTONE_TTL
    """How long a swept run's tombstone refuses its retries, from the sweep."""
    batch_size: int = 500
    """Threads read per scan statement."""
    throttle: float = 0.0
    """Seconds to pause after each swept thread (0: full speed)."""
    lock_timeout: float = 0.2
    """Longest wait, in seconds, for a thread's lease row; a thread not granted it is
    skipped (``busy``) and tried again by the next sweep."""
    limit: int | None = None
    """Stop after sweeping this many threads (None: all expired ones)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigurationError(
                f"Unknown retention strategy {self.strategy!r}; use 'delete' or 'keep_latest'."
            )
        if self.default_ttl is not None and self.default_ttl <= _dt.timedelta(0):
            raise ConfigurationError(f"default_ttl must be positive, got {self.default_ttl}.")
        if self.batch_size < 1 or self.throttle < 0 or self.lock_timeout <= 0:
            raise ConfigurationError(
                "batch_size must be >= 1, throttle >= 0 and lock_timeout > 0 seconds."
            )


@dataclass
class SweepReport:
    """What a sweep found (dry run) or did (applied)."""

    applied: bool
    strategy: str
    scanned: int = 0
    #: threads past their TTL (swept, or skipped below)
    expired: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)
    #: reason (SKIP_REASONS) -> threads past their TTL left as they are
    skipped: dict[str, list[str]] = field(default_factory=dict)
    rows_freed: int = 0
    bytes_freed: int = 0
    tombstones_expired: int = 0
    seconds: float = 0.0
    #: False when the database has only PostgresSaver's tables (a dry run still works)
    ours: bool = True

    def threads_label(self) -> str:
        """``"N threads"``, for messages."""
        return f"{self.scanned} thread" + ("" if self.scanned == 1 else "s")

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready values (``prune --json`` prints it)."""
        return {
            "applied": self.applied, "strategy": self.strategy, "scanned": self.scanned,
            "expired": self.expired, "swept": self.swept, "skipped": self.skipped,
            "rows_freed": self.rows_freed, "bytes_freed": self.bytes_freed,
            "tombstones_expired": self.tombstones_expired,
            "seconds": round(self.seconds, 3), "ours": self.ours,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Candidate:
    thread_id: str
    latest: str
    last_write: _dt.datetime
    ttl: _dt.timedelta | None
    interrupted: bool
    leased: bool
    queued: bool


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def checkpoint_time(checkpoint_id: str) -> _dt.datetime | None:
    """The time embedded in a uuid6 checkpoint id (None for any other id)."""
    try:
        u = uuid.UUID(checkpoint_id)
    except ValueError:
        return None
    if u.version != 6:
        return None
    h = u.hex
    ticks = int(h[0:8] + h[8:12] + h[13:16], 16)
    try:
        return _dt.datetime.fromtimestamp((ticks - _UUID6_EPOCH) / 1e7, _dt.UTC)
    except (ValueError, OverflowError, OSError):  # not a time datetime can hold
        return None


def _ttl_of(value: Any, default: _dt.timedelta | None) -> _dt.timedelta | None:
    if value is None:
        return default
    if value == "never":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return _dt.timedelta(minutes=value)
    return default  # an unusable override: the policy's (documented)


_SCAN = """
WITH t AS (
    SELECT c.thread_id, max(c.checkpoint_id) AS latest
    FROM checkpoints c
    WHERE c.thread_id > %(after)s
    GROUP BY c.thread_id ORDER BY c.thread_id LIMIT %(batch)s
)
SELECT t.thread_id, t.latest,
       CASE WHEN t.latest !~ '^[0-9a-f]{8}-[0-9a-f]{4}-6' THEN  -- not a uuid6: its ts
           (SELECT l.checkpoint ->> 'ts' FROM checkpoints l
            WHERE l.thread_id = t.thread_id AND l.checkpoint_id = t.latest LIMIT 1) END,
       h.metadata -> 'retention_ttl_minutes',
       EXISTS (SELECT 1 FROM checkpoint_writes w
               WHERE w.thread_id = t.thread_id AND w.checkpoint_ns = ''
                 AND w.checkpoint_id = h.checkpoint_id AND w.channel = '__interrupt__'),
       {ours}
FROM t
LEFT JOIN LATERAL (
    SELECT h.checkpoint_id, h.metadata FROM checkpoints h
    WHERE h.thread_id = t.thread_id AND h.checkpoint_ns = ''
    ORDER BY h.checkpoint_id DESC LIMIT 1
) h ON true
ORDER BY t.thread_id
"""
_SCAN_OURS = """(SELECT max(r.updated_at) FROM lgd_runs r WHERE r.thread_id = t.thread_id),
       EXISTS (SELECT 1 FROM lgd_leases l WHERE l.thread_id = t.thread_id
               AND l.ended IS NULL AND l.expires_at > now()),
       EXISTS (SELECT 1 FROM lgd_queue q WHERE q.thread_id = t.thread_id
               AND q.expires_at > now()),
       EXISTS (SELECT 1 FROM lgd_repairs p WHERE p.backup_thread_id = t.thread_id)"""
_SCAN_PEER = "NULL::timestamptz, false, false, false"
_HAS_OURS = (
    "SELECT to_regclass('lgd_leases') IS NOT NULL, to_regclass('lgd_swept_runs') IS NOT NULL"
)
_CLAIM = (
    "SELECT * FROM lgd_sweep_claim_v1(%(thread_id)s, %(latest)s, %(before)s, %(strategy)s,"
    " %(expire_interrupted)s, %(token)s, %(lock_timeout)s)"
)
_DELETE = "SELECT lgd_sweep_delete_v1(%(thread_id)s, %(token)s)"
_TRIM = "SELECT * FROM lgd_sweep_trim_v1(%(thread_id)s, %(token)s)"
_BUSY_STATES = frozenset({"55P03", "40P01"})  # lock_not_available, deadlock_detected
_EXPIRE_TOMBSTONES = """
WITH gone AS (
    DELETE FROM {table} WHERE ctid IN (
        SELECT ctid FROM {table} WHERE swept_at < now() - %(ttl)s::interval LIMIT %(batch)s)
    RETURNING 1
)
SELECT count(*) FROM gone
"""


_GATE = """WITH RECURSIVE refusal AS (
    SELECT current_setting('lgd.sweep', true) IS DISTINCT FROM %(token)s AS refused
), heads AS ("""
# A DeltaChannel's value at a head is its nearest ancestor's snapshot plus the writes of
# every checkpoint between (LangGraph's get_delta_channel_history): the walk keeps that
# window, as the saver's delta_history query reads it (a channel stops at a checkpoint
# holding a value for it, inline or in a blob that is not "empty"). The oldest
# checkpoint kept becomes the namespace's root, and the walk stops there.
_DELTA_WINDOW = """), walk AS (
    SELECT h.checkpoint_ns, p.checkpoint_id, p.parent_checkpoint_id, p.checkpoint,
           ARRAY(SELECT jsonb_object_keys(hc.metadata -> 'counters_since_delta_snapshot'))
               AS walking
    FROM heads h
    JOIN checkpoints hc
      ON hc.thread_id = %(thread_id)s AND hc.checkpoint_ns = h.checkpoint_ns
     AND hc.checkpoint_id = h.checkpoint_id
    JOIN checkpoints p
      ON p.thread_id = %(thread_id)s AND p.checkpoint_ns = h.checkpoint_ns
     AND p.checkpoint_id = h.parent_checkpoint_id
    WHERE jsonb_typeof(hc.metadata -> 'counters_since_delta_snapshot') = 'object'
  UNION ALL
    SELECT w.checkpoint_ns, p.checkpoint_id, p.parent_checkpoint_id, p.checkpoint,
           ARRAY(SELECT ch FROM unnest(w.walking) AS ch WHERE NOT (ch = ANY(s.stopped)))
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT ARRAY(
            SELECT ch FROM unnest(w.walking) AS ch
            WHERE jsonb_typeof(w.checkpoint -> 'channel_values' -> ch) <> 'null'
               OR EXISTS (SELECT 1 FROM checkpoint_blobs b
                          WHERE b.thread_id = %(thread_id)s
                            AND b.checkpoint_ns = w.checkpoint_ns
                            AND b.channel = ch AND b.type <> 'empty'
                            AND b.version = w.checkpoint -> 'channel_versions' ->> ch)
        ) AS stopped
    ) s
    JOIN checkpoints p
      ON p.thread_id = %(thread_id)s AND p.checkpoint_ns = w.checkpoint_ns
     AND p.checkpoint_id = w.parent_checkpoint_id
    WHERE cardinality(w.walking) > cardinality(s.stopped)
), latest AS (
    SELECT checkpoint_ns, checkpoint_id FROM heads
    UNION
    SELECT checkpoint_ns, checkpoint_id FROM walk
    UNION"""


def _keep_latest_sql() -> str:
    """saver.prune's keep_latest statement for a sweep: it acts only when this
    transaction's claim said 'go' (lgd.sweep holds its token; otherwise it refuses,
    changing nothing), and it keeps the DeltaChannel window of each head instead of
    refusing a DeltaChannel thread."""
    sql = queries()["prune_keep_latest"]
    head = sql.index("), heads AS (")
    latest = "), latest AS (\n    SELECT checkpoint_ns, checkpoint_id FROM heads\n    UNION"
    assert sql.startswith("WITH refusal AS (") and latest in sql, (
        "prune_keep_latest changed: update the sweep's variant of it"
    )
    body = sql[head + len("), heads AS (") :].replace(latest, _DELTA_WINDOW, 1)
    return _GATE + body


Step = Operation[Any] | float
Progress = Callable[[int, int, str], None]


def plan(
    policy: RetentionPolicy,
    *,
    apply: bool,
    now: _dt.datetime | None = None,
    progress: Progress | None = None,
) -> Generator[Step, Any, SweepReport]:
    """The sweep, sans-I/O: yields operations (run them and send back their result) and
    pauses (seconds to sleep, send back None); returns the report. ``progress(scanned,
    swept, thread_id)`` after each thread it sweeps or skips."""
    started = time.monotonic()
    report = SweepReport(applied=apply, strategy=policy.strategy)
    has = yield _read(_HAS_OURS, {})
    ours, migrated = bool(has[0][0]), bool(has[0][1])
    report.ours = ours
    if apply and not migrated:
        raise SchemaNotReadyError(
            "prune --apply (saver.sweep(apply=True)) writes the tombstones that keep retries "
            "of swept runs safe (migration 0026). Nothing was deleted. Fix: run "
            "`langgraph-deterministic migrate` (or saver.setup()) on this database first; "
            "a dry run needs no migration."
        )
    scan = _SCAN.replace("{ours}", _SCAN_OURS if ours else _SCAN_PEER)
    clock = now or _now()
    after = ""
    keep_sql = _keep_latest_sql() if apply and policy.strategy == "keep_latest" else ""
    while policy.limit is None or len(report.swept) < policy.limit:
        rows = yield _read(scan, {"after": after, "batch": policy.batch_size})
        if not rows:
            break
        after = rows[-1][0]
        report.scanned += len(rows)
        for cand in _candidates(rows, policy):
            if cand.ttl is None or cand.last_write >= clock - cand.ttl:
                continue
            if policy.limit is not None and len(report.swept) >= policy.limit:
                break
            report.expired.append(cand.thread_id)
            reason = (
                "leased" if cand.leased
                else "queued" if cand.queued
                else "interrupted" if cand.interrupted and not policy.expire_interrupted
                else None
            )  # fmt: skip
            if reason is None and apply:
                reason, rows_freed, bytes_freed = yield _sweep_thread(
                    cand, clock - cand.ttl, policy, keep_sql
                )
                if reason is None:
                    report.rows_freed += rows_freed
                    report.bytes_freed += bytes_freed
                    if policy.throttle:
                        yield policy.throttle
            if reason is not None:
                report.skipped.setdefault(reason, []).append(cand.thread_id)
            else:
                report.swept.append(cand.thread_id)
            if progress is not None:
                progress(report.scanned, len(report.swept), cand.thread_id)
        if len(rows) < policy.batch_size:
            break
    if apply:
        for table in ("lgd_swept_runs", "lgd_swept_threads"):
            while True:
                n = yield _expire_tombstones(table, policy)
                report.tombstones_expired += n
                if n < policy.batch_size:
                    break
    report.seconds = time.monotonic() - started
    return report


def _candidates(rows: Sequence[Sequence[Any]], policy: RetentionPolicy) -> list[_Candidate]:
    found = []
    for thread_id, latest, ts, ttl_value, interrupted, ledger, leased, queued, backup in rows:
        if backup:
            continue  # a repair backup: it goes with the thread it backs up
        times = [t for t in (checkpoint_time(latest), ledger) if t is not None]
        if not times and (stamp := _iso(ts)) is not None:
            times.append(stamp)
        if not times:
            continue  # no time to judge by: never expires
        found.append(
            _Candidate(
                thread_id,
                latest,
                max(times),
                _ttl_of(ttl_value, policy.default_ttl),
                bool(interrupted),
                bool(leased),
                bool(queued),
            )
        )
    return found


def _iso(text: str | None) -> _dt.datetime | None:
    """checkpoint["ts"] as LangGraph writes it (ISO 8601, UTC); None if it is not one."""
    if not text:
        return None
    try:
        stamp = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.UTC)


def _read(sql: str, params: Mapping[str, Any]) -> Operation[list[tuple[Any, ...]]]:
    (rows,) = yield Batch.read(sql, params)
    return rows or []


def _sweep_thread(
    cand: _Candidate, before: _dt.datetime, policy: RetentionPolicy, keep_sql: str
) -> Operation[tuple[str | None, int, int]]:
    """One thread, one transaction: (skip reason or None, rows freed, bytes freed)."""
    token = secrets.token_hex(8)
    params = {
        "thread_id": cand.thread_id, "latest": cand.latest, "before": before,
        "strategy": policy.strategy, "expire_interrupted": policy.expire_interrupted,
        "token": token, "lock_timeout": f"{int(policy.lock_timeout * 1000)}ms",
    }  # fmt: skip
    claim = Statement(_CLAIM, params, fetch=True, prepare=False)
    if policy.strategy == "delete":
        batch = Batch.write(claim, Statement(_DELETE, params, fetch=True))
    else:
        batch = Batch.write(
            claim,
            Statement(keep_sql, {"thread_id": cand.thread_id, "token": token}, fetch=True,
                      prepare=False),
            Statement(_TRIM, params, fetch=True),
        )  # fmt: skip
    try:
        results = yield batch
    except Exception as exc:
        # A row of the thread locked past lock_timeout (the claim's setting holds for the
        # whole transaction), or a deadlock: rolled back whole; the next sweep retries.
        if getattr(exc, "sqlstate", None) in _BUSY_STATES:
            return "busy", 0, 0
        raise
    after_rows, after_bytes = 0, 0
    if policy.strategy == "keep_latest":
        left = results[2] or []
        after_rows, after_bytes = (int(left[0][0] or 0), int(left[0][1] or 0)) if left else (0, 0)
    verdict, _backups, before_rows, before_bytes = (results[0] or [])[0]
    if verdict != "go":
        return verdict, 0, 0
    return None, int(before_rows or 0) - after_rows, int(before_bytes or 0) - after_bytes


def _expire_tombstones(table: str, policy: RetentionPolicy) -> Operation[int]:
    (rows,) = yield Batch.write(
        Statement(
            _EXPIRE_TOMBSTONES.replace("{table}", table),
            {"ttl": policy.tombstone_ttl, "batch": policy.batch_size},
            fetch=True,
        )
    )
    return int(rows[0][0]) if rows else 0


def drive(
    steps: Generator[Step, Any, SweepReport], run: Callable[[Operation[Any]], Any]
) -> SweepReport:
    """Run :func:`plan` synchronously with the saver's ``_run``."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, float):
                time.sleep(step)
                step = steps.send(None)
            else:
                step = steps.send(run(step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(
    steps: Generator[Step, Any, SweepReport], run: Callable[[Operation[Any]], Any]
) -> SweepReport:
    """:func:`drive` with the saver's async ``_arun``."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, float):
                await asyncio.sleep(step)
                step = steps.send(None)
            else:
                step = steps.send(await run(step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class Sweeper:
    """An opt-in background sweep every ``interval`` (Platform's
    ``sweep_interval_minutes``), in a daemon thread of a worker process::

        sweeper = Sweeper(saver, RetentionPolicy(default_ttl=timedelta(days=30)),
                          interval=timedelta(minutes=60))
        sweeper.start()   # ... sweeper.stop() at shutdown

    or, in an asyncio worker, ``await sweeper.aserve()`` as a task. A sweep that fails
    (the database unreachable, say) is reported to ``on_error`` and tried again at the
    next interval; several processes may run one: each thread's sweep is its own
    transaction under its lease row, so they never remove a thread twice."""

    def __init__(
        self,
        saver: SweepingSaver,
        policy: RetentionPolicy,
        *,
        interval: _dt.timedelta = _dt.timedelta(minutes=60),
        on_sweep: Callable[[SweepReport], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if interval <= _dt.timedelta(0):
            raise ConfigurationError(f"interval must be positive, got {interval}.")
        self.saver, self.policy, self.interval = saver, policy, interval
        self.on_sweep, self.on_error = on_sweep, on_error
        self.reports: list[SweepReport] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> SweepReport:
        """One sweep now, applied, in the calling thread."""
        report = self.saver.sweep(self.policy, apply=True)
        self._record(report)
        return report

    def _record(self, report: SweepReport) -> None:
        self.reports = [*self.reports[-9:], report]
        if self.on_sweep is not None:
            self.on_sweep(report)

    def _failed(self, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(exc)

    def start(self) -> Sweeper:
        """Sweep now and every ``interval`` in a daemon thread; returns the sweeper."""
        if self._thread is not None:
            raise ConfigurationError("This Sweeper runs already; stop() it first.")
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="lgd-sweeper", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # reported; the next interval tries again
                self._failed(exc)
            self._stop.wait(self.interval.total_seconds())

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop after the sweep in progress, if any (waits up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    async def aserve(self) -> None:
        """Sweep now and every ``interval`` until cancelled (with ``asweep``)."""
        while True:
            try:
                self._record(await self.saver.asweep(self.policy, apply=True))
            except Exception as exc:  # reported; the next interval tries again
                self._failed(exc)
            await asyncio.sleep(self.interval.total_seconds())


__all__ = [
    "DEFAULT_TOMBSTONE_TTL",
    "SKIP_REASONS",
    "TTL_KEY",
    "RetentionPolicy",
    "SweepReport",
    "Sweeper",
    "checkpoint_time",
    "parse_duration",
    "plan",
]
