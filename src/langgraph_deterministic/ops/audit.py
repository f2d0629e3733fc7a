"""``langgraph-deterministic audit``: find the threads that retries have already damaged.

A read-only scan of the checkpoint tables of langgraph-checkpoint-postgres (and of our
ledger, ``lgd_runs``, when it exists). It walks the threads in ranges of about
``batch_rows`` checkpoints, one short autocommit statement per range under a bounded
``statement_timeout`` (a range that hits it is split and retried), so it holds no snapshot
for long and takes no lock a live worker could wait for.

Everything is decided in SQL from the checkpoints' JSON metadata, except two things that
need LangGraph's serde: the head's messages (decoded only when the blob holds a tool call)
and the inputs of the rare input checkpoints applied on an unfinished step. Decoding runs
in a second thread while Postgres scans the next range, except beside live workers: there
it runs after each range's statement, so the audit keeps at most one core busy.

Fault classes (:data:`FAULTS`); all but ``no_run_id`` count as damage:

``no_run_id`` (risk)
    The head checkpoint carries no ``run_id``: a retry of the call that wrote it applies its
    input again. Not damage by itself; adopt ``run_config`` to remove the risk.
``reapplied_input``
    An input was applied on top of an unfinished step, and it was the same input as the
    previous one (same or no run id): a retry re-applied it.
``unfinished_step``
    The head has a step left to run, no interrupt is waiting for an answer, and nothing has
    written to the thread for ``idle``: the worker died and nobody retried.
``unanswered_tool_call``
    An AIMessage's tool call has no ToolMessage, and the conversation went on after it (or
    the thread ended there): every chat provider refuses such a history (HTTP 400).
``forked_history``
    Two checkpoints written by graph runs (source ``loop``/``input``) continue the same
    checkpoint: two attempts of a run ran at once (a zombie and its retry). Forks made on
    purpose (``update_state``/time travel: source ``update``/``fork``) are not reported.
``unfinished_run``
    The ledger shows a run as running while its thread has been idle on an unfinished step.
``unreadable``
    A row of the thread cannot be read: the head's JSON is not an object, or a blob the
    audit decodes is truncated, of an unknown kind or names a type off the allow-list
    (nothing it names is imported or called). Reads of the thread raise; repair refuses it.

Threads whose id starts with ``lgd-backup:`` (the copies ``repair`` keeps) are skipped;
faults recorded before a thread's last repair checkpoint are not reported again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import ormsgpack
import psycopg
from langchain_core.messages import BaseMessage

from langgraph_deterministic._db.translate import sentence
from langgraph_deterministic._dsn import chained, scrub
from langgraph_deterministic._messages import (
    as_messages,
    input_readings,
    key,
    unanswered_calls,
)
from langgraph_deterministic._serde import SafeSerializer, guarded_loads
from langgraph_deterministic.errors import (
    DatabaseUnavailableError,
    DeterministicError,
    SchemaNotReadyError,
)
from langgraph_deterministic.ops import (
    DEFAULT_IDLE,
    STATEMENT_TIMEOUT_MS,
    _connect,
    _priority,
    queries,
)

__all__ = ["AuditReport", "Finding", "HeadState", "audit", "unanswered_calls"]

Severity = Literal["risk", "damage"]


@dataclass(frozen=True, slots=True)
class FaultClass:
    name: str
    severity: Severity
    meaning: str
    fix: str


FAULTS: Final[dict[str, FaultClass]] = {
    f.name: f
    for f in (
        FaultClass(
            "no_run_id", "risk",
            "the head checkpoint has no run_id: a retry would apply its input again",
            "call the graph with run_config(thread_id, run_id) (nothing to repair)",
        ),
        FaultClass(
            "reapplied_input", "damage",
            "the same input was applied again on top of an unfinished step (a retry)",
            "repair removes the duplicate input messages",
        ),
        FaultClass(
            "unfinished_step", "damage",
            "the head has a step left to run and the thread has been idle",
            "retry the run with its run id, or repair closes the step",
        ),
        FaultClass(
            "unanswered_tool_call", "damage",
            "a tool call has no ToolMessage and the conversation went on (provider 400)",
            "repair answers it with an explicit 'tool result unknown' ToolMessage",
        ),
        FaultClass(
            "forked_history", "damage",
            "two graph runs continued the same checkpoint (a zombie and its retry)",
            "repair moves the branch that is not the head to a backup thread",
        ),
        FaultClass(
            "unfinished_run", "damage",
            "the ledger shows a run as running on a thread idle on an unfinished step",
            "retry the run with its run id, or repair closes it",
        ),
        FaultClass(
            "unreadable", "damage",
            "a stored checkpoint or blob cannot be read (not a JSON object, truncated, a "
            "type off the allow-list): reads of the thread fail",
            "repair refuses it: restore the thread's rows from a backup or delete the thread",
        ),
    )
}  # fmt: skip

DEFAULT_BATCH_ROWS: Final = 20_000
"""The most checkpoints one range may hold (fewer when ranges run slower than
:data:`RANGE_TARGET_S`)."""
RANGE_TARGET_S: Final = 0.025
"""How long one range's statements should run: the range grows or shrinks towards it. A
live worker's commit that meets the scan waits behind a short CPU burst, not a long one
(on 2 cores, 10 ms bursts of a CPU loop at half duty moved 8 writers' p99 9%, 65 ms
bursts 38%: docs/explanation/performance.md)."""
AUTO_DUTY: Final = 0.25
"""Beside live workers the automatic pace keeps the scan's statements running at most this
share of the time (one range, then a wait three times as long). At idle priority what the
audit still costs the workers grows with its share of the time (on the quiet 2-core
machine, 8 writers' p99 moved 1.07x pooled at 0.25, 1.14x at 0.5, 1.33x at full speed:
docs/explanation/performance.md); beside them it then takes ~35-50 s per 2M checkpoints."""
AUDIT_WORK_MEM: Final = "64MB"
"""work_mem of the audit's one backend: a range's working set stays in memory, so the
audit writes no temp file (at 4 MB a 20,000-checkpoint range spilled 2.5 MB to disk)."""
_clock: Callable[[], float] = time.monotonic  # the pacer's clock (a benchmark replaces it)
AUTO_BUSY_WAL_BYTES_PER_S: Final = 16_384
"""WAL written this fast between two ranges (a few checkpoint puts a second) means live
workers: the audit itself writes none."""
_MIN_BATCH_ROWS: Final = 250
# Every tool call LangChain stores has "type": "tool_call"; msgpack writes that value as the
# fixstr 0xa9 + "tool_call" ("tool_call_id" and "invalid_tool_calls" are longer strings).
TOOL_CALL_MARK: Final = b"\xa9tool_call"
# A tool call as LangChain serialises it ends with ..."id": <str>, "type": "tool_call";
# a ToolMessage carries "tool_call_id": <str>. msgpack strs: fixstr (0xa0-0xbf) or str8.
_CALL_TAIL: Final = b"\xa4type" + TOOL_CALL_MARK
_ANSWER_KEY: Final = b"\xactool_call_id"


def _strs_after(blob: bytes, key: bytes) -> Iterator[tuple[bytes, int]]:
    """(value, end offset) of every msgpack str that follows ``key`` in ``blob``."""
    at = blob.find(key)
    while at >= 0:
        start = at + len(key)
        tag = blob[start] if start < len(blob) else 0
        if 0xA0 <= tag <= 0xBF:
            n, start = tag - 0xA0, start + 1
        elif tag == 0xD9 and start + 1 < len(blob):
            n, start = blob[start + 1], start + 2
        else:
            n = -1
        if n >= 0:
            yield blob[start : start + n], start + n
        at = blob.find(key, start)


def surely_answered(blob: bytes) -> bool:
    """True when the raw messages blob shows every tool call answered by a ToolMessage,
    without decoding it (about 100x cheaper than the serde). False means "decode to
    know": the blob did not have the expected shape, or a call may be unanswered."""
    calls = blob.count(TOOL_CALL_MARK)
    ids = [(v, end) for v, end in _strs_after(blob, b"\xa2id") if blob.startswith(_CALL_TAIL, end)]
    if len(ids) != calls:
        return False
    # An answer counts after its call only (_messages.unanswered_calls): the blob holds
    # the messages in order, so the last answer of each id must lie past the call.
    last_answer = {v: end for v, end in _strs_after(blob, _ANSWER_KEY)}
    return all(last_answer.get(i, -1) > at for i, at in ids)


def _skip(code: int, data: bytes) -> None:
    return None


def parses(type_: str, blob: bytes) -> bool:
    """Whether a msgpack blob is whole: its outer structure parses (~10 us for 40
    messages; the extension payloads stay undecoded, nothing is built)."""
    if type_ != "msgpack":
        return True
    try:
        ormsgpack.unpackb(blob, ext_hook=_skip, option=ormsgpack.OPT_NON_STR_KEYS)
    except (ValueError, TypeError):  # ormsgpack.MsgpackDecodeError is a ValueError
        return False
    return True


@dataclass(frozen=True, slots=True)
class Finding:
    thread_id: str
    fault: str
    checkpoint_id: str
    detail: str

    @property
    def severity(self) -> Severity:
        return FAULTS[self.fault].severity


@dataclass(slots=True)
class HeadState:
    """What the scan learnt about a thread's head checkpoint (repair reuses it)."""

    thread_id: str
    checkpoints: int
    head_id: str
    ts: datetime | None
    run_id: str | None
    source: str | None
    pending: bool
    interrupted: bool
    idle: bool
    running_runs: list[str] = field(default_factory=list)

    @property
    def in_progress(self) -> bool:
        """A worker may still be running this thread: a step is left and it is recent."""
        return self.pending and not self.interrupted and not self.idle


@dataclass(slots=True)
class AuditReport:
    threads: int = 0
    checkpoints: int = 0
    active_threads: int = 0
    seconds: float = 0.0
    paused_seconds: float = 0.0  # of ``seconds``, waiting to leave room to live workers
    # the CPU priority of the audit's threads and of its server backend (ops/_priority.py)
    priority: str = "normal"
    backend_priority: str = "normal"
    findings: list[Finding] = field(default_factory=list)
    heads: dict[str, HeadState] = field(default_factory=dict)

    def by_thread(self, severity: Severity | None = None) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            if severity is None or f.severity == severity:
                out.setdefault(f.thread_id, []).append(f)
        return out

    @property
    def damaged(self) -> dict[str, list[Finding]]:
        return self.by_thread("damage")

    def counts(self) -> dict[str, int]:
        seen: dict[str, set[str]] = {name: set() for name in FAULTS}
        for f in self.findings:
            seen[f.fault].add(f.thread_id)
        return {name: len(threads) for name, threads in seen.items()}

    @property
    def exit_code(self) -> int:
        return 1 if self.damaged else 0

    def to_json(self) -> dict[str, Any]:
        threads: list[dict[str, Any]] = [
            {
                "thread_id": thread_id,
                "faults": sorted({f.fault for f in found}),
                # written within ``idle``: a run may still be going (repair waits for it)
                "run_in_progress": thread_id in self.heads
                and self.heads[thread_id].in_progress,
                "findings": [
                    {k: v for k, v in asdict(f).items() if k != "thread_id"}
                    | {"severity": f.severity}
                    for f in found
                ],
            }
            for thread_id, found in sorted(self.by_thread().items())
        ]
        return {
            "clean": not self.damaged,
            "threads_scanned": self.threads,
            "checkpoints_scanned": self.checkpoints,
            "active_threads": self.active_threads,
            "seconds": round(self.seconds, 3),
            "paused_seconds": round(self.paused_seconds, 3),
            "priority": self.priority,
            "backend_priority": self.backend_priority,
            "counts": self.counts(),
            "damaged_threads": [t for t in threads if set(t["faults"]) - {"no_run_id"}],
            "risk_threads": [t for t in threads if t["faults"] == ["no_run_id"]],
            # rows the audit could not read (reads of these threads raise; repair refuses them)
            "unreadable_threads": [t["thread_id"] for t in threads if "unreadable" in t["faults"]],
        }


class AuditError(DeterministicError):
    """The audit could not finish a range of threads (the reason and the fix are named)."""


# --- messages: shared with repair ---------------------------------------------------


def input_key(values: dict[str, Any], messages_channel: str) -> Any:
    """What an input checkpoint applied, comparable between two attempts: the messages
    channel as LangGraph read it (:func:`~langgraph_deterministic._messages.as_messages`:
    every input form, ids aside), other channels by value."""
    out = []
    for channel, value in sorted(values.items()):
        if channel == messages_channel:
            readings = input_readings(value)
            if readings:
                out.append((channel, "messages", tuple(key(m) for m in readings[0])))
                continue
        out.append((channel, "value", _plain(value)))
    return tuple(out)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseMessage):
        return key(value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    return repr(value)


# --- the scan -----------------------------------------------------------------------


def connect(
    dsn: str, *, statement_timeout_ms: int = STATEMENT_TIMEOUT_MS, work_mem: str | None = None
) -> psycopg.Connection[Any]:
    """An autocommit connection for ops work, with a bounded statement_timeout."""
    options = f"-c statement_timeout={int(statement_timeout_ms)} -c lock_timeout=2000"
    if work_mem is not None:
        options += f" -c work_mem={work_mem}"
    return _connect.connect(dsn, options=options)


def _check_schema(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT to_regclass('checkpoints') IS NOT NULL AND to_regclass('checkpoint_blobs') "
        "IS NOT NULL AND to_regclass('checkpoint_writes') IS NOT NULL, "
        "to_regclass('lgd_runs') IS NOT NULL"
    ).fetchone()
    assert row is not None
    if not row[0]:
        raise SchemaNotReadyError(
            "this database has no checkpoint tables (checkpoints, checkpoint_blobs, "
            "checkpoint_writes). Fix: point --dsn / DATABASE_URL at the database your "
            "PostgresSaver or DeterministicSaver writes to."
        )
    return bool(row[1])


def estimate_checkpoints(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        "SELECT reltuples::bigint FROM pg_class WHERE oid = 'checkpoints'::regclass"
    ).fetchone()
    return int(row[0]) if row and row[0] and row[0] > 0 else None


def _next_bound(conn: psycopg.Connection[Any], lo: str, rows: int) -> str | None:
    found = conn.execute(queries("audit")["next_bound"], {"lo": lo, "rows": rows}).fetchone()
    return None if found is None else str(found[0])


class _Scanner:
    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        now: datetime,
        idle: timedelta,
        since: datetime | None,
        only: str | None,
        ledger: bool,
        messages_channel: str,
        serde: SafeSerializer,
    ) -> None:
        self.conn, self.now, self.idle, self.since, self.only = conn, now, idle, since, only
        self.ledger, self.channel, self.serde = ledger, messages_channel, serde

    def fetch(
        self, lo: str, hi: str | None
    ) -> tuple[list[Any], dict[str, list[str]], dict[str, Any]]:
        params = {
            "lo": lo, "hi": hi, "only": self.only, "since": self.since,
            "messages": self.channel, "tool_call": TOOL_CALL_MARK,
        }  # fmt: skip
        # binary: the heads' message blobs come as bytes, not hex text (encoding and
        # decoding the hex cost the server 6% of its CPU and us ~0.5 s per 2M checkpoints)
        with self.conn.cursor(binary=True) as cur:
            rows = cur.execute(queries("audit")["scan_batch"], params).fetchall()
        running: dict[str, list[str]] = {}
        if self.ledger:
            for thread_id, runs in self.conn.execute(
                queries("audit")["ledger_running"], {"lo": lo, "hi": hi, "only": self.only}
            ):
                running[thread_id] = list(runs)
        inputs: dict[str, Any] = {}
        for row in rows:
            pairs = [p for p in (row[9] or ()) if p[1] is not None]
            if pairs:
                ids = sorted({i for p in pairs for i in p})
                inputs[row[0]] = (
                    pairs,
                    {
                        r[0]: r[1:]
                        for r in self.conn.execute(
                            queries("audit")["input_writes"], {"thread_id": row[0], "ids": ids}
                        )
                    },
                )
        return rows, running, inputs

    def analyse(
        self, rows: list[Any], running: dict[str, list[str]], inputs: dict[str, Any]
    ) -> tuple[list[Finding], list[HeadState], int, float]:
        """The findings, heads and checkpoints of a fetched range, and the CPU seconds this
        took (the pacer counts them: on the server's machine they compete as the SQL does)."""
        cpu = time.thread_time()
        findings: list[Finding] = []
        heads: list[HeadState] = []
        checkpoints = 0
        for row in rows:
            (thread_id, n, head_id, ts, run_id, source, pending, interrupted,
             fork_parents, _pairs, msg_type, msg_blob, unreadable) = row  # fmt: skip
            checkpoints += n
            when = _parse_ts(ts)
            idle = when is None or self.now - when >= self.idle
            head = HeadState(
                thread_id,
                n,
                head_id,
                when,
                run_id,
                source,
                bool(pending),
                bool(interrupted),
                idle,
                running.get(thread_id, []),
            )
            heads.append(head)

            def add(fault: str, detail: str, at: str = head_id, tid: str = thread_id) -> None:
                findings.append(Finding(tid, fault, at, detail))

            if unreadable is not None:
                add("unreadable", f"the head checkpoint cannot be read: {unreadable}")
                continue
            if run_id is None:
                add("no_run_id", f"head checkpoint written by a call without run id ({source})")
            stuck = head.pending and not head.interrupted and head.idle
            if stuck:
                add("unfinished_step", f"a step is left to run; last write {ts}")
                if head.running_runs:
                    add("unfinished_run", "ledger: running: " + ", ".join(head.running_runs))
            for parent in fork_parents or ():
                add("forked_history", "two graph runs continued this checkpoint", parent)
            try:
                if thread_id in inputs:
                    pairs, writes = inputs[thread_id]
                    for later, earlier in pairs:
                        if self._same_input(writes.get(later), writes.get(earlier)):
                            add("reapplied_input", f"same input as checkpoint {earlier}", later)
                messages = None
                if msg_blob is not None and not parses(msg_type, msg_blob):
                    add("unreadable", f"its {self.channel!r} blob is truncated or corrupt")
                    continue
                if msg_blob is not None and not surely_answered(msg_blob):
                    messages = as_messages(guarded_loads(self.serde, msg_type, msg_blob))
            except Exception as exc:  # refused by the allow-list, truncated, unknown kind
                add("unreadable", f"a blob cannot be read: {type(exc).__name__}: {exc}"[:500])
                continue
            for _, call, followed in unanswered_calls(messages) if messages is not None else ():
                if followed or not head.pending:
                    add(
                        "unanswered_tool_call",
                        f"tool call {call.get('id')} ({call.get('name')}) has no result",
                    )
        return findings, heads, checkpoints, time.thread_time() - cpu

    def _same_input(self, a: Any, b: Any) -> bool:
        if not a or not b:
            return False
        serde = self.serde
        values_a = {ch: guarded_loads(serde, t, bl) for ch, t, bl in zip(*a, strict=True)}
        values_b = {ch: guarded_loads(serde, t, bl) for ch, t, bl in zip(*b, strict=True)}
        return bool(values_a) and input_key(values_a, self.channel) == input_key(
            values_b, self.channel
        )


def _parse_ts(ts: str | None) -> datetime | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts)
    except ValueError:
        return None


def _next_rows(rows: int, took: float, most: int) -> int:
    """The next range's size: towards RANGE_TARGET_S of statement time, changing by at
    most a factor of two a range (one slow range under a burst of load is not a trend)."""
    scaled = rows * RANGE_TARGET_S / max(took, 1e-4)
    return min(most, max(_MIN_BATCH_ROWS, int(min(rows * 2, max(rows / 2, scaled)))))


class Pacer:
    """How long the audit waits after each range.

    A fixed ``pause`` (seconds; 0 = full speed) when one is given. Otherwise automatic: no
    wait while the database is quiet (an audit alone runs at full speed), and, while live
    workers write to it (the server's WAL grows), a wait that keeps the scan's share of
    the time at ``duty``. When the WAL cannot be read, it assumes live workers.
    :attr:`live` says whether the audit should assume live workers for the next range.
    """

    def __init__(
        self,
        pause: float | None = None,
        *,
        duty: float = AUTO_DUTY,
        busy_wal_bytes_per_s: float = AUTO_BUSY_WAL_BYTES_PER_S,
    ) -> None:
        if pause is not None and pause < 0:
            raise ValueError("pause must be >= 0 seconds, or None for the automatic pace")
        if not 0 < duty <= 1:
            raise ValueError("duty must be in (0, 1]")
        self.pause = pause
        self.duty = duty
        self.busy_wal_bytes_per_s = busy_wal_bytes_per_s
        self.busy_ranges = 0
        self.waited = 0.0
        # live workers seen after the last range (before the first: assumed, to be careful)
        self.live = pause is None or pause > 0

    @property
    def automatic(self) -> bool:
        return self.pause is None

    def wait_after(self, took: float, wal_bytes: int | None, interval: float) -> float:
        """Seconds to wait after a range whose statements took ``took`` seconds, when
        ``wal_bytes`` of WAL were written in the ``interval`` seconds since the last one."""
        if self.pause is not None:
            wait = self.pause
        else:
            busy = wal_bytes is None or wal_bytes >= self.busy_wal_bytes_per_s * max(interval, 1e-3)
            self.busy_ranges += busy
            self.live = busy
            wait = took * (1 - self.duty) / self.duty if busy else 0.0
        self.waited += wait
        return wait


def _wal_position(conn: psycopg.Connection[Any]) -> int | None:
    """The server's WAL position in bytes, or None where it cannot be read (no rights, a
    proxy that hides it): the pacer then assumes live workers."""
    try:
        row = conn.execute(queries("audit")["wal_position"]).fetchone()
    except (
        psycopg.errors.InsufficientPrivilege,
        psycopg.errors.FeatureNotSupported,
        psycopg.errors.ObjectNotInPrerequisiteState,
    ):
        return None
    return int(row[0]) if row and row[0] is not None else None


def audit(
    dsn: str,
    *,
    thread_id: str | None = None,
    since: datetime | None = None,
    idle: timedelta = DEFAULT_IDLE,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    statement_timeout_ms: int = STATEMENT_TIMEOUT_MS,
    messages_channel: str = "messages",
    progress: Callable[[int, int | None], None] | None = None,
    pause: float | None = None,
    duty: float | None = None,
    priority: Literal["idle", "normal"] = "normal",
) -> AuditReport:
    """Scan the checkpoint database at ``dsn``; returns the findings (writes nothing).

    ``since`` keeps threads whose head was written at or after it; ``idle`` is how long a
    thread with a step left must have been quiet to count as stuck rather than running;
    ``progress(done, total)`` is called after each range (checkpoints; total estimated);
    ``pause`` sleeps that many seconds between ranges (0: full speed); ``None`` (the
    default) paces automatically: full speed on a quiet database, and beside live workers
    (its WAL grows) a wait after each range that keeps the scan's statements running a
    ``duty`` share of the time (default :data:`AUTO_DUTY`; see :class:`Pacer`). Ranges
    grow or shrink (up to ``batch_rows`` checkpoints) so that each runs about
    :data:`RANGE_TARGET_S`. ``priority="normal"`` (the default) leaves every process's
    scheduling as it is. ``priority="idle"`` (opt-in, Linux) runs the audit's threads, and
    its server backend where the server is on this machine, at ``SCHED_IDLE`` (and in an
    ``lgd-idle`` cgroup where permitted): live workers preempt it at once (see
    :mod:`~langgraph_deterministic.ops._priority`); the report's ``priority`` and
    ``backend_priority`` say what it got.
    """
    if priority not in ("idle", "normal"):
        raise ValueError("priority must be 'idle' or 'normal'")
    lowered = priority == "idle"
    report = AuditReport()
    started = datetime.now().timestamp()
    pacer = Pacer(pause) if duty is None else Pacer(pause, duty=duty)
    with connect(dsn, statement_timeout_ms=statement_timeout_ms, work_mem=AUDIT_WORK_MEM) as conn:
        if lowered:
            report.backend_priority = _priority.idle_backend(conn)
        ledger = _check_schema(conn)
        total = None if thread_id else estimate_checkpoints(conn)
        now_row = conn.execute("SELECT now()").fetchone()
        assert now_row is not None
        now: datetime = now_row[0]
        scanner = _Scanner(
            conn, now=now, idle=idle, since=since, only=thread_id, ledger=ledger,
            messages_channel=messages_channel, serde=SafeSerializer(),
        )  # fmt: skip
        done = 0
        pool = ThreadPoolExecutor(
            1, thread_name_prefix="lgd-audit-decode",
            initializer=_priority.set_idle_thread if lowered else None,
        )  # fmt: skip
        pending: Future[tuple[list[Finding], list[HeadState], int, float]] | None = None

        def collect(analysed: tuple[list[Finding], list[HeadState], int, float]) -> float:
            nonlocal done
            found, heads, n, cpu = analysed
            report.findings.extend(found)
            for h in heads:
                report.heads[h.thread_id] = h
                report.active_threads += h.in_progress
            report.threads += len(heads)
            report.checkpoints += n
            done += n
            if progress is not None:
                progress(done, total)
            return cpu

        stop = threading.Event()
        lo, rows = "", min(batch_rows, 2_000)
        try:
            with _priority.idle_thread(lowered) as report.priority:
                wal, wal_at = (_wal_position(conn) if pacer.automatic else None), _clock()
                while True:
                    range_started = _clock()
                    hi = None if thread_id else _next_bound(conn, lo, rows)
                    try:
                        fetched = scanner.fetch(lo, hi)
                    except psycopg.errors.QueryCanceled as exc:
                        if rows <= _MIN_BATCH_ROWS:
                            raise AuditError(
                                f"scanning the threads after {lo!r} exceeded statement_timeout "
                                f"({statement_timeout_ms} ms) even for {rows} checkpoints. Fix: "
                                "raise --statement-timeout, or run the audit when the server "
                                "is less loaded"
                                + (
                                    " or without --priority idle (at idle priority it gets "
                                    "only the CPU no one else wants)"
                                    if lowered
                                    else ""
                                )
                                + "; it wrote nothing."
                            ) from exc
                        rows //= 2  # a range too slow for the timeout: split it
                        continue
                    took = sql = _clock() - range_started  # the server's share of the range
                    if pending is not None:
                        took += collect(pending.result())  # and ours: the last range's analysis
                        pending = None
                    if pacer.live:
                        # beside live workers the audit takes one core at a time: its backend's
                        # statement, then its own analysis, never both at once (on 2 cores the
                        # overlap left the workers none; docs/explanation/performance.md)
                        took += collect(scanner.analyse(*fetched))
                    else:  # alone: decode this range while Postgres scans the next one
                        pending = pool.submit(scanner.analyse, *fetched)
                    if hi is None:
                        break
                    lo, rows = hi, _next_rows(rows, sql, batch_rows)
                    written = None
                    if pacer.automatic:
                        now_wal = _wal_position(conn)
                        if now_wal is not None and wal is not None:
                            written = now_wal - wal
                        wal = now_wal
                    wait = pacer.wait_after(took, written, _clock() - wal_at)
                    wal_at = _clock()
                    if wait:
                        stop.wait(wait)
                if pending is not None:
                    collect(pending.result())
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"the audit lost its connection: {sentence(scrub(str(exc), dsn))} Fix: check the server "
                "and run the audit again (it wrote nothing)."
            ) from chained(exc, dsn)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if "cgroup" in report.priority + report.backend_priority:
        _priority.release_idle_group()
    report.seconds = datetime.now().timestamp() - started
    report.paused_seconds = pacer.waited
    return report
