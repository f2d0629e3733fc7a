"""``PostgresJournal``: durable ops inside nodes, journaled in Postgres next to the checkpoints.

``DeterministicRunner(journal=PostgresJournal(saver))`` needs no external engine. The
journal is *keyed*, not positional: an op is addressed by

    (thread, the task's checkpoint namespace, "<op name>#<n>")

where the task's namespace is the one LangGraph gives every task (``node:<task id>``,
nested with ``|`` inside subgraphs). Task ids derive from the checkpoint the task runs
from, so a retry that resumes that checkpoint - in any process - addresses the same rows,
and parallel tasks need no ordering at all. ``n`` counts ops of one name within one
execution of the node (a node retried by its RetryPolicy starts counting again, so it
finds the ops its first execution stored).

Per new op, one statement (the rule, with its proof obligations, is in
docs/explanation/architecture.md, "The journal's round trips and fence"):

0. The run's admission (the saver's start of a graph run under ``run_config``) registers
   the attempt in the journal inside the statement it sends anyway
   (``lgd_journal_admit_v2``: the takeover a first claim would make) and
   hands the session its fence check (``JOURNAL_ADMISSION``, :meth:`_Session.admitted`):
   the run's first op runs on it, as in 2.
1. The first op of a task whose checkpoint the run did not create (it loaded it: a
   retry, a resumed interrupt), and a run's first op without an admission, sends
   ``lgd_journal_claim_v2``: it returns the op's stored outcome or claims it for this
   attempt (``LG430`` if the attempt lost the thread, and then ``fn`` never runs), plus
   every other op the task has in the journal. The
   task's replayed ops need no statement at all. A claim is not waited on for the WAL
   flush: a lost claim is an op not yet claimed.
2. Every outcome (result, or terminal error) is stored by ``lgd_journal_store_v4``
   (which tells a claim or registration the database lost in a failover from a
   takeover), and durably committed (the WAL flushed, unless ``synchronous_commit=False``), before it is
   returned; the same statement checks the fence - the attempt is not fenced off, its
   checkpoint not continued, nobody else holds the thread's lease - under the same row
   lock a claim takes. A new op that starts within ``claim_ahead`` seconds of that answer
   (or of the admission's) runs on that check (*claim-ahead*) instead of a claim of its
   own, and its outcome is inserted only while the fence still holds: the task's next op,
   or the first op of a task of a checkpoint this run created after its attempt was
   registered (the saver tells the session which checkpoints it loads and writes:
   ``CHECKPOINT_EVENTS``). Anything else (an op another attempt has claimed, a stale or
   failed check, the second of concurrent ops) claims first, as in 1.

An op in flight when its worker died has no outcome (a claim, or no row at all on
claim-ahead): the retry takes it over or simply runs it again (at-least-once; ``idempotency_key()`` lets the op's API deduplicate).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from langgraph_deterministic._compat.langgraph import var_child_runnable_config
from langgraph_deterministic._db.batch import Batch, Statement
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic._serde import guarded_loads
from langgraph_deterministic.checkpointer.contract import GRAPH_RUN_MARKER, RUN_ID_KEY
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    JournaledOpError,
    JournalLimitError,
    NondeterminismError,
    SerializationError,
)

from ._context import _IDEMPOTENCY_KEY, IN_OP, make_idempotency_key

if TYPE_CHECKING:
    from langgraph_deterministic.checkpointer.contract import HeldLease
    from langgraph_deterministic.checkpointer.saver import DeterministicSaver

SQLSTATE_LOST = "LG430"
_ERROR_TYPE = "lgd-error"
_CLAIM_RETRIES = 5  # a deadlock between two attempts taking over each other's ops


#: HTTP statuses a retry may get past: server errors, rate limits, request timeouts.
_TRANSIENT_STATUS = frozenset({408, 429})


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an error carries (``status_code`` or ``status``, or its
    ``response``'s: httpx, requests, aiohttp, the OpenAI and Anthropic SDKs), if any."""
    for holder in (exc, getattr(exc, "response", None)):
        for name in ("status_code", "status"):
            status = getattr(holder, name, None)
            if isinstance(status, int) and not isinstance(status, bool):
                return status
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether a failure of a durable op's function is transient: not stored in the
    journal, so the retry runs the op again (the default of ``PostgresJournal``'s
    ``is_terminal`` is its negation). The one place this is defined:

    * ``TimeoutError`` (``asyncio.TimeoutError`` and ``socket.timeout`` are it) and
      ``ConnectionError`` (``ConnectionResetError``, ``ConnectionRefusedError``,
      ``ConnectionAbortedError``, ``BrokenPipeError``);
    * an error carrying an HTTP status (``status_code`` / ``status``, or its
      ``response``'s) of 5xx, 408 or 429; any other status is terminal;
    * otherwise LangGraph's default retry rule (``langgraph.types.default_retry_on``),
      with one deliberate difference: that rule treats every other ``OSError`` as
      permanent, and so do we, except the timeouts and connection errors above, which
      it would store and replay forever as the op's outcome.

    Not an ``Exception`` (a ``KeyboardInterrupt``, a cancellation) is never an outcome.
    """
    if not isinstance(exc, Exception):
        return True
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status = _http_status(exc)
    if status is not None:
        return status >= 500 or status in _TRANSIENT_STATUS
    from langgraph.types import default_retry_on  # type: ignore[attr-defined]

    return bool(default_retry_on(exc))


def _default_terminal(exc: BaseException) -> bool:
    """Terminal, i.e. stored and replayed: every failure :func:`is_transient` is not."""
    return not is_transient(exc)


@dataclass(frozen=True, slots=True)
class OpRef:
    """The journal address of one durable op, and who runs it."""

    thread_id: str
    task_ns: str
    op_key: str
    checkpoint_ns: str
    checkpoint_id: str
    run_id: str | None
    attempt: str

    @property
    def idempotency_key(self) -> str:
        return make_idempotency_key(self.thread_id, self.task_ns, self.op_key)

    def params(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "task_ns": self.task_ns,
            "op_key": self.op_key,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "run_id": self.run_id,
            "attempt": self.attempt,
        }


@dataclass
class JournalStats:
    """What one run did with the journal (``runner.last_stats``), for tests and benchmarks."""

    attempt: str = ""
    executed: list[str] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)
    #: executed ops that ran on the fence check of their task's previous statement
    ahead: list[str] = field(default_factory=list)
    round_trips: int = 0
    #: op key -> server time of the claim that let this attempt run it
    claimed_at: dict[str, Any] = field(default_factory=dict)


# --- the two statements, sans-I/O (driven by the saver's sync or async driver) ----------


def _lost(ref: OpRef, exc: BaseException) -> ConcurrentRunError:
    detail = getattr(getattr(exc, "diag", None), "message_detail", None) or str(exc)
    return ConcurrentRunError(
        f"Durable op {ref.op_key!r} of task {ref.task_ns!r} on thread {ref.thread_id!r} was "
        f"not run: this attempt has lost the thread ({detail}). Another attempt of the run "
        "(a retry, while this one was still alive) took over. Stop this attempt: the other "
        "one continues from what the journal and the checkpoints hold.",
        # Lost to an attempt of its own run: its release leaves the lease to that one.
        # When the other attempt only continued the checkpoint (this one still holds
        # the run in the journal), the call may resume from its checkpoint
        # (DeterministicRunner).
        lost_to_run=ref.run_id,
        checkpoint_race=True,
    )


def _claim(ref: OpRef) -> Generator[Batch, Any, list[tuple[Any, ...]]]:
    """``lgd_journal_claim_v2``: the task's other ops in the journal, then ``ref``'s row."""
    for attempt in range(_CLAIM_RETRIES):
        try:
            (rows,) = yield Batch.read(queries()["journal_claim_v2"], ref.params())
        except psycopg.errors.DeadlockDetected:
            if attempt == _CLAIM_RETRIES - 1:
                raise
            continue
        except psycopg.Error as exc:
            if exc.sqlstate == SQLSTATE_LOST:
                raise _lost(ref, exc) from None
            raise
        return list(rows)
    raise AssertionError("unreachable")  # pragma: no cover


# What an op asks its driver for (PostgresJournal._op): a saver operation, or its function.
_DB, _CALL = "db", "call"
_Steps = Generator[tuple[str, Any], Any, Any]

_ASYNC_COMMIT = Statement("SELECT set_config('synchronous_commit', 'off', true)")


def _store(
    ref: OpRef,
    claimed_at: Any,
    claimed: bool,
    status: str,
    type_: str,
    blob: bytes,
    synchronous: bool = True,
) -> Generator[Batch, Any, Any]:
    """``lgd_journal_store_v4``: store the outcome; return the fence check a next op may
    start on (None: this attempt no longer holds the thread). A claim the database lost
    (a failover) is stored as a claim-ahead op would be; a lost registration raises the
    retryable DatabaseUnavailableError, a takeover ConcurrentRunError."""
    params = {
        **ref.params(),
        "claimed": claimed,
        "fence_at": None if claimed else claimed_at,
        "status": status,
        "type": type_,
        "blob": blob,
    }
    store = Statement(queries()["journal_store_v4"], params, fetch=True)
    if synchronous:
        (rows,) = yield Batch((store,))
    else:  # one pipeline, one implicit transaction: still one round trip
        _, rows = yield Batch.write(_ASYNC_COMMIT, store)
    stored, fence_at, lost = rows[0]
    if lost:
        raise DatabaseUnavailableError(
            f"The outcome of durable op {ref.op_key!r} of task {ref.task_ns!r} on thread "
            f"{ref.thread_id!r} was not stored: the database no longer holds this attempt's "
            "registration, which it had acknowledged - a failover to a standby that had "
            "not received it (asynchronous replication, or a write committed without "
            "waiting for the WAL flush), or a restore. It cannot tell whether another "
            "attempt took over meanwhile. Retry the call with the same run_id: the retry "
            "runs this op again (at least once in all; idempotency_key() lets its API "
            "deduplicate)."
        )
    if not stored:
        raise ConcurrentRunError(
            f"The outcome of durable op {ref.op_key!r} of task {ref.task_ns!r} on thread "
            f"{ref.thread_id!r} was not stored: another attempt took the op or the thread "
            "over while it ran here (it runs the op again, at least once in all). Stop "
            "this attempt."
        )
    return fence_at


@dataclass
class _Fence:
    """A fence check: at server time ``at`` this attempt held the thread (the answer came
    back at local monotonic time ``local``). One new op may start on it (``used``)."""

    at: Any
    local: float
    used: bool = False


@dataclass
class _TaskView:
    """What one session knows of a task's ops in the journal (read by its claims)."""

    stored: dict[str, tuple[str, str | None, bytes | None]] = field(default_factory=dict)
    #: ops claimed by an attempt when last read: only a claim may decide them
    busy: set[str] = field(default_factory=set)
    #: the newest fence check of a statement of this task
    fence: _Fence | None = None


# --- outcomes --------------------------------------------------------------------------


def _dump_error(exc: BaseException) -> bytes:
    cls = type(exc)
    try:
        args: Any = json.loads(json.dumps(list(exc.args)))
    except (TypeError, ValueError):
        args = None
    return json.dumps(
        {"module": cls.__module__, "qualname": cls.__qualname__, "args": args, "message": str(exc)}
    ).encode("utf-8")


def _load_error(blob: bytes) -> BaseException:
    data = json.loads(blob)
    name = f"{data['module']}.{data['qualname']}"
    try:  # only a module already imported: stored data never makes us import one
        cls: Any = sys.modules[data["module"]]
        for part in data["qualname"].split("."):
            cls = getattr(cls, part)
        if (
            isinstance(cls, type)
            and issubclass(cls, Exception)
            and not issubclass(cls, DeterministicError)
            and data["args"] is not None
        ):
            exc: BaseException = cls(*data["args"])
            if str(exc) == data["message"]:
                return exc
    except Exception:  # the type is gone or wants other arguments: fall through
        pass
    return JournaledOpError(f"{name}: {data['message']}")


# --- the session ---------------------------------------------------------------------


class _Session:
    """One runner call on a :class:`PostgresJournal` (a ``KeyedSession``)."""

    def __init__(self, journal: PostgresJournal, attempt: str) -> None:
        self._journal = journal
        self._saver = journal.saver
        self._sync_commit = journal.synchronous_commit
        self.attempt = attempt
        self.stats = JournalStats(attempt=attempt)
        self._lock = threading.Lock()  # sync nodes run in LangGraph's thread pool
        self._counters: dict[tuple[str, int], dict[str, int]] = {}
        self._inflight: set[tuple[str, str]] = set()
        self._tasks: dict[str, _TaskView] = {}
        #: per thread: the newest fence check of any task (a task's first op may start on it)
        self._fences: dict[str, _Fence] = {}
        #: threads where the attempt has a row in lgd_journal_attempts (a claim was answered)
        self._registered: set[str] = set()
        #: (thread, namespace) whose checkpoints this session loaded through the saver, and
        #: (thread, checkpoint id) of those loaded or written before it was registered:
        #: a task of any other checkpoint in such a namespace runs from one this run's own
        #: loop created after its attempt was registered
        self._loaded_ns: set[tuple[str, str]] = set()
        self._not_ours: set[tuple[str, str]] = set()

    def _holds_run(self, thread_id: str) -> Generator[Batch, Any, bool]:
        (rows,) = yield Batch.read(
            queries()["journal_holds_run"], {"thread_id": thread_id, "attempt": self.attempt}
        )
        return bool(rows[0][0])

    def holds_run(self, thread_id: str) -> bool:
        """Whether this attempt still holds its run in the journal: no other attempt of
        the run fenced it off (one round trip; asked only after a lost race)."""
        return self._saver.run_operation(self._holds_run(thread_id))

    async def aholds_run(self, thread_id: str) -> bool:
        return await self._saver.arun_operation(self._holds_run(thread_id))

    def checkpoint_event(self, kind: str, config: Any, checkpoint_id: str | None) -> None:
        """The saver loaded, or is about to write, a checkpoint (``CHECKPOINT_EVENTS``)."""
        configurable = (config or {}).get("configurable") or {}
        thread = str(configurable.get("thread_id"))
        with self._lock:
            if kind == "load":
                self._loaded_ns.add((thread, str(configurable.get("checkpoint_ns") or "")))
                for cid in (checkpoint_id, configurable.get("checkpoint_id")):
                    if cid is not None:
                        self._not_ours.add((thread, str(cid)))
            elif thread not in self._registered:
                self._not_ours.add((thread, str(checkpoint_id)))

    def admitted(self, saver: Any, held: HeldLease, asked: float) -> None:
        """The saver admitted this attempt's graph run and registered the attempt in the
        journal in the same statement (``JOURNAL_ADMISSION``, ``lgd_journal_admit_v2``): a
        fence check, as a first claim's, that the first op of a task of a checkpoint the
        run creates may start on (``asked``: when the admission was sent, so the fence is
        no fresher than it looks)."""
        if saver is not self._saver:  # maybe another database: its row is not ours to use
            return
        with self._lock:
            self._registered.add(held.thread_id)
            self._fences[held.thread_id] = _Fence(held.fence_at, asked)

    def _new_fence(self, ref: OpRef, view: _TaskView, at: Any) -> None:
        fence = _Fence(at, time.monotonic())
        view.fence = self._fences[ref.thread_id] = fence

    # identity -------------------------------------------------------------------------

    def _ref(self, name: str) -> OpRef:
        outer = IN_OP.get()
        if outer is not None:
            raise NondeterminismError(
                f"durable op {name!r} was started inside durable op {outer!r}. The outer op's "
                "result is journaled, so on a retry its function does not run and the inner "
                "op would never be asked for. Fix: call the inner op from the node, next to "
                "the outer one, not from inside its function."
            )
        config = var_child_runnable_config.get() or {}
        configurable = config.get("configurable") or {}
        runtime = configurable.get(GRAPH_RUN_MARKER)
        info = getattr(runtime, "execution_info", None)
        thread_id = configurable.get("thread_id")
        if info is None or thread_id is None:
            raise ConfigurationError(
                f"durable op {name!r} ran outside a graph node, or in a graph without a "
                "checkpointer and thread_id: PostgresJournal addresses ops by the task that "
                "runs them. Fix: call durable() from a node (or a tool or middleware it "
                "runs) of a graph compiled with the DeterministicSaver, with a config made "
                "by run_config(thread_id, run_id)."
            )
        task_ns = str(info.checkpoint_ns)
        attempt_no = int(getattr(info, "node_attempt", 1) or 1)
        with self._lock:
            counters = self._counters.setdefault((task_ns, attempt_no), {})
            n = counters.get(name, 0)
            counters[name] = n + 1
            key = f"{name}#{n}"
            if (task_ns, key) in self._inflight:  # pragma: no cover - counters prevent it
                raise NondeterminismError(f"durable op {key!r} is already in flight")
        run_id = (config.get("metadata") or {}).get(RUN_ID_KEY)
        return OpRef(
            thread_id=str(thread_id),
            task_ns=task_ns,
            op_key=key,
            checkpoint_ns=task_ns.rpartition("|")[0],
            checkpoint_id=str(info.checkpoint_id),
            run_id=str(run_id) if run_id is not None else None,
            attempt=self.attempt,
        )

    # outcome handling ---------------------------------------------------------------

    def _stored(self, ref: OpRef, status: str, type_: str | None, blob: bytes | None) -> Any:
        with self._lock:
            self.stats.replayed.append(ref.op_key)
        if status == "error":
            raise _load_error(blob or b"{}")
        return guarded_loads(self._saver.serde, type_ or "null", blob or b"")

    def _encode(self, ref: OpRef, value: Any) -> tuple[str, bytes]:
        try:
            type_, blob = self._saver.serde.dumps_typed(value)
        except Exception as exc:
            raise SerializationError(
                f"Cannot journal the result of durable op {ref.op_key!r} (a "
                f"{type(value).__name__}): {exc}. Return JSON-like data, dataclasses, "
                "pydantic models, bytes or LangChain messages, or give the saver a serde "
                "that handles this type. Nothing was stored; a retry runs the op again."
            ) from exc
        limit = self._journal.max_result_bytes
        if limit is not None and len(blob) > limit:
            raise JournalLimitError(
                f"The result of durable op {ref.op_key!r} is {len(blob)} bytes serialised, "
                f"more than the journal's max_result_bytes={limit}. Nothing was stored; a "
                "retry runs the op again. Fix: store the payload elsewhere (object storage, "
                "a table) and return a reference to it, or raise "
                "PostgresJournal(saver, max_result_bytes=...)."
            )
        return type_, blob

    def _begin(self, ref: OpRef, claimed_at: Any, ahead: bool) -> tuple[Any, Any]:
        with self._lock:
            self._inflight.add((ref.task_ns, ref.op_key))
            self.stats.executed.append(ref.op_key)
            if ahead:
                self.stats.ahead.append(ref.op_key)
            self.stats.claimed_at[f"{ref.task_ns}/{ref.op_key}"] = claimed_at
        return IN_OP.set(ref.op_key), _IDEMPOTENCY_KEY.set(ref.idempotency_key)

    def _end(self, ref: OpRef, tokens: tuple[Any, Any]) -> None:
        IN_OP.reset(tokens[0])
        _IDEMPOTENCY_KEY.reset(tokens[1])
        with self._lock:
            self._inflight.discard((ref.task_ns, ref.op_key))

    def _fenced(self, ref: OpRef) -> None:
        with self._lock:
            self.stats.fenced.append(ref.op_key)
            self.stats.round_trips += 1

    def _count(self) -> None:
        with self._lock:
            self.stats.round_trips += 1

    # the one-round-trip rule ---------------------------------------------------------

    def _take(self, fence: _Fence | None) -> Any:
        """``fence``'s server time if a new op may start on it (fresh, unused), else None."""
        if fence is None or fence.used:
            return None
        fence.used = True  # one op per fence check
        if time.monotonic() - fence.local > self._journal.claim_ahead:
            return None
        return fence.at

    def _decide(self, ref: OpRef) -> tuple[str, Any]:
        """How to start an op: ``("replay", stored)`` from what the task's last claim read;
        ``("ahead", fence_at)``: run it on a fence check (claim-ahead) - its task's
        previous statement's, or for a task's first op any task's, when this run created
        the task's checkpoint after its first claim; ``("claim", None)``: claim first."""
        with self._lock:
            view = self._tasks.get(ref.task_ns)
            if view is None:
                # Nobody else can hold rows of a task whose checkpoint this run created
                # once its attempt was registered: an attempt that read that checkpoint
                # fenced this one off with its first claim, which the fence check sees.
                if (ref.thread_id, ref.checkpoint_ns) not in self._loaded_ns or (
                    ref.thread_id,
                    ref.checkpoint_id,
                ) in self._not_ours:
                    return "claim", None
                at = self._take(self._fences.get(ref.thread_id))
                if at is None:
                    return "claim", None
                self._tasks[ref.task_ns] = _TaskView()
                return "ahead", at
            hit = view.stored.get(ref.op_key)
            if hit is not None:
                return "replay", hit
            if ref.op_key in view.busy:
                return "claim", None
            at = self._take(view.fence)
            return ("claim", None) if at is None else ("ahead", at)

    def _claimed(
        self, ref: OpRef, rows: list[tuple[Any, ...]]
    ) -> tuple[str, str | None, bytes | None, Any]:
        with self._lock:
            self._registered.add(ref.thread_id)
            view = self._tasks.setdefault(ref.task_ns, _TaskView())
            for key, status, type_, blob, _, _ in rows[:-1]:
                if status == "running":
                    view.busy.add(key)
                else:
                    view.stored[key] = (status, type_, blob)
                    view.busy.discard(key)
            _, status, type_, blob, claimed_at, fence_at = rows[-1]
            view.busy.discard(ref.op_key)
            if status != "run":  # replayed: the claim's fence check is left to the next op
                view.stored[ref.op_key] = (status, type_, blob)
                if fence_at is not None:
                    self._new_fence(ref, view, fence_at)
        return status, type_, blob, claimed_at

    def _kept(self, ref: OpRef, status: str, type_: str, blob: bytes, fence_at: Any) -> None:
        with self._lock:
            view = self._tasks.setdefault(ref.task_ns, _TaskView())
            view.stored[ref.op_key] = (status, type_, blob)
            if fence_at is not None:
                self._new_fence(ref, view, fence_at)

    def _store_step(
        self, ref: OpRef, claimed_at: Any, claimed: bool, status: str, type_: str, blob: bytes
    ) -> _Steps:
        self._count()
        fence_at = yield (
            _DB,
            _store(ref, claimed_at, claimed, status, type_, blob, self._sync_commit),
        )
        self._kept(ref, status, type_, blob, fence_at)

    # the op ------------------------------------------------------------------------

    def _op(self, name: str) -> _Steps:
        """One durable op, sans-I/O: yields ``(_DB, operation)`` for the saver to run and
        ``(_CALL, None)`` for the op's function; ``run_op`` / ``arun_op`` drive it."""
        ref = self._ref(name)
        action, found = self._decide(ref)
        if action == "replay":
            return self._stored(ref, *found)
        claimed = action == "claim"
        claimed_at = found
        if claimed:
            try:
                rows = yield _DB, _claim(ref)
            except ConcurrentRunError:
                self._fenced(ref)
                raise
            self._count()
            status, type_, blob, claimed_at = self._claimed(ref, rows)
            if status != "run":
                return self._stored(ref, status, type_, blob)
        tokens = self._begin(ref, claimed_at, ahead=not claimed)
        try:
            try:
                value = yield _CALL, None
            finally:
                IN_OP.reset(tokens[0])
                _IDEMPOTENCY_KEY.reset(tokens[1])
                tokens = (IN_OP.set(None), _IDEMPOTENCY_KEY.set(None))
        except Exception as exc:
            if self._journal.is_terminal(exc) and not _never_stored(exc):
                yield from self._store_step(
                    ref, claimed_at, claimed, "error", _ERROR_TYPE, _dump_error(exc)
                )
            raise
        finally:
            self._end(ref, tokens)
        type_, blob = self._encode(ref, value)
        yield from self._store_step(ref, claimed_at, claimed, "ok", type_, blob)
        return value

    async def arun_op(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        steps = self._op(name)
        try:
            kind, operation = next(steps)
            while True:
                try:
                    if kind == _DB:
                        result = await self._saver.arun_operation(operation)
                    else:
                        result = fn(*args, **kwargs)
                        if inspect.isawaitable(result):
                            result = await result
                except BaseException as exc:
                    kind, operation = steps.throw(exc)
                else:
                    kind, operation = steps.send(result)
        except StopIteration as stop:
            return stop.value

    def run_op(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        steps = self._op(name)
        try:
            kind, operation = next(steps)
            while True:
                try:
                    if kind == _DB:
                        result = self._saver.run_operation(operation)
                    else:
                        result = fn(*args, **kwargs)
                        if inspect.isawaitable(result):
                            raise ConfigurationError(
                                f"durable_sync({name!r}) got an async function. Fix: await "
                                "durable(...) in an async node, or pass a sync function."
                            )
                except BaseException as exc:
                    kind, operation = steps.throw(exc)
                else:
                    kind, operation = steps.send(result)
        except StopIteration as stop:
            return stop.value


def _never_stored(exc: BaseException) -> bool:
    """Our own errors and LangGraph's control flow (interrupt() inside an op) are never
    an op's outcome."""
    from langgraph.errors import GraphBubbleUp

    return isinstance(exc, DeterministicError | GraphBubbleUp | asyncio.CancelledError)


class PostgresJournal:
    """Journal durable ops in Postgres, through a :class:`DeterministicSaver`.

    >>> runner = DeterministicRunner(journal=PostgresJournal(saver))
    >>> runner.invoke(graph, inputs, run_config(thread_id, run_id))    # or ainvoke/astream

    The graph must be compiled with the same saver (or one on the same database): ops are
    addressed by the tasks of its checkpoints, and fenced by the same attempt tokens.

    ``max_result_bytes``: the largest serialised result stored (default 8 MiB).
    ``is_terminal(exc)``: which failures of an op's function are its outcome, stored and
    raised again on a retry without running it; others are not stored. By default every
    failure :func:`is_transient` is not (timeouts, connection errors, HTTP 5xx/408/429
    are transient).
    ``synchronous_commit=False``: an op's outcome is stored without waiting for the WAL
    flush (Postgres' ``synchronous_commit = off`` for that one transaction). A killed
    *worker* loses nothing; a crash of the *Postgres server* within its WAL writer delay
    (200 ms by default) can lose the newest outcomes, and those ops run again (use
    idempotency keys). The claim before an op never waits for the flush.
    ``claim_ahead`` (seconds, default 0.1; 0 turns it off): a new op whose task's previous
    journal statement, answered at most this long ago, found the attempt still holding the
    thread runs on that fence check instead of a claim of its own (one round trip per op;
    the exact rule is in docs/how-to/durable-ops-without-restate.md).
    """

    keyed = True

    def __init__(
        self,
        saver: DeterministicSaver,
        *,
        max_result_bytes: int | None = 8 * 1024 * 1024,
        is_terminal: Callable[[BaseException], bool] | None = None,
        synchronous_commit: bool = True,
        claim_ahead: float = 0.1,
    ) -> None:
        from langgraph_deterministic.checkpointer.saver import DeterministicSaver

        if not isinstance(saver, DeterministicSaver):
            raise ConfigurationError(
                f"PostgresJournal needs a DeterministicSaver, got {type(saver).__name__}. "
                "Fix: PostgresJournal(DeterministicSaver(dsn_or_pool)), the saver the graph "
                "is compiled with."
            )
        if max_result_bytes is not None and max_result_bytes <= 0:
            raise ConfigurationError("max_result_bytes must be positive (or None: no limit).")
        if not claim_ahead >= 0:
            raise ConfigurationError(
                f"claim_ahead must be >= 0 seconds (0: a claim before every new op), got "
                f"{claim_ahead!r}."
            )
        self.saver = saver
        self.claim_ahead = float(claim_ahead)
        self.max_result_bytes = max_result_bytes
        self.is_terminal = is_terminal or _default_terminal
        self.synchronous_commit = synchronous_commit

    def open_session(self, attempt: str | None = None) -> _Session:
        """A session for one runner call; ``attempt`` is the call's attempt token."""
        return _Session(self, attempt or secrets.token_hex(16))


__all__ = ["JournalStats", "OpRef", "PostgresJournal", "is_transient"]
