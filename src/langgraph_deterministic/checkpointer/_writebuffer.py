"""A superstep's pending writes, stored in the transaction of the checkpoint that ends it.

LangGraph saves every finished task's writes with ``put_writes`` and, once the superstep
is over, its checkpoint with ``put``; under ``durability="sync"`` it waits for that
``put`` before the next superstep starts. Committed one call at a time, a run pays one
commit (a WAL flush) and one round trip per task on top of one per superstep. Here the
writes of a graph run this saver admitted wait in memory for the ``put`` whose parent is
their checkpoint, and go out in its pipeline, in one transaction: a finished task's
writes are durable before the next superstep starts, as before, with one commit per
superstep. What does not wait:

* special writes (an error, an interrupt, a resume, a scheduled task) and input and
  Command writes: stored at once, with the writes of the same checkpoint waiting so far;
* writes outside a graph run this saver admitted (``update_state``, direct calls, runs
  without ``run_config``), where no end of run is heard. A run's subgraphs share its
  ``run_config`` recorder: their writes wait for their own namespace's put.

A write whose checkpoint already has its child waits for the run's next put, in any of its
namespaces: LangGraph submits a superstep's writes and then its checkpoint to a thread
pool, where the put can overtake a writes call still on its way (often so on Python 3.13).
That checkpoint already holds what the late write carries, so a retry needs none of it.

Writes wait at most ``window`` seconds (``DeterministicSaver(buffer_writes=...)``,
default 0.05): a task that finished while its siblings still run (a fan-out of slow model
calls) has its writes stored on their own by then, and the put continuing their
checkpoint waits for that commit, so it never becomes durable before them. Whatever is
still waiting when the graph call ends, returns or raises, is stored in the transaction
that releases the run's lease; a read of the thread in this process stores it first.

The trade-off: a worker killed within ``window`` of a task's end, before its superstep's
checkpoint, loses that task's writes (it runs again on the retry), where a commit per
call loses them only while that call is in flight. Nothing a finished superstep wrote is
at risk. A timed store that fails (a lost connection) is logged; those tasks run again on
a retry, as after a crash. ``buffer_writes=0`` commits every call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import psycopg

from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic.checkpointer._sqlstate import SQLSTATES

logger = logging.getLogger("langgraph_deterministic")

# (checkpoint_ns, checkpoint_id) of the checkpoint pending writes belong to
Key = tuple[str, str]
# the checkpoint id of a namespace's late writes (their checkpoint has its child already):
# no checkpoint has it; any put of the run takes them
LATE = "*"
# A timed store in flight: the put continuing its checkpoint waits for it.
Waiter = threading.Event | asyncio.Future[None]


@dataclass(slots=True)
class _Run:
    thread_id: str
    sync: bool  # a sync run: the timer thread stores its expired writes
    pending: dict[Key, list[Statement]] = field(default_factory=dict)
    due: dict[Key, float] = field(default_factory=dict)
    timers: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    flushing: dict[Key, Waiter] = field(default_factory=dict)
    # checkpoints whose child has been written: a write for them no longer waits
    sealed: set[Key] = field(default_factory=set)


class WriteBuffer:
    """Pending writes per graph run attempt, waiting for their checkpoint's child.

    Keyed by the attempt token, not the thread: a zombie attempt in the same process
    (its lease taken over) must not have its writes folded into the winner's put, where
    its fence would refuse the winner's whole transaction. Thread-safe: LangGraph's sync
    loop calls ``put_writes`` and ``put`` from executor threads. ``store`` / ``astore``
    commit statements on their own (the timed store)."""

    def __init__(
        self,
        window: float,
        store: Callable[[list[Statement]], None],
        astore: Callable[[list[Statement]], Awaitable[None]],
    ) -> None:
        self.window = window
        self._store, self._astore = store, astore
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._timer = _TimerThread(self._next_due, self._fire_expired)

    def add(
        self,
        attempt: str,
        thread_id: str,
        key: Key,
        statements: Sequence[Statement],
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        """Keep ``statements`` for the put that continues ``key`` or, when that put has
        been made already, for the run's next put (``LATE``). ``loop``: the event loop of
        an async run (its timed store runs there), None for a sync run."""
        with self._lock:
            run = self._runs.get(attempt)
            if run is None:
                run = self._runs[attempt] = _Run(thread_id, sync=loop is None)
            if key in run.sealed:
                key = (key[0], LATE)
            waiting = run.pending.get(key)
            if waiting is not None:
                waiting.extend(statements)
                return
            run.pending[key] = list(statements)
            run.due[key] = time.monotonic() + self.window
            if loop is not None:
                run.timers[key] = loop.call_later(self.window, self._afire, attempt, key)
        if loop is None:
            self._timer.kick()

    def take(self, attempt: str, key: Key, *, seal: bool) -> tuple[list[Statement], Waiter | None]:
        """The writes waiting for ``key`` (for the put continuing it: ``seal``, so a
        later write of that checkpoint is stored on its own). If a timed store of them is
        in flight, ``([], waiter)``: wait for it, then take again."""
        if attempt not in self._runs:  # unlocked fast path: nothing buffered for it
            return [], None
        with self._lock:
            run = self._runs.get(attempt)
            if run is None:
                return [], None
            if (waiter := run.flushing.get(key)) is not None:
                return [], waiter
            if not seal:
                return self._pop(run, key), None
            run.sealed.add(key)
            late = [k for k in run.pending if k[1] == LATE and k not in run.flushing]
            return [st for k in (*late, key) for st in self._pop(run, k)], None

    def end(self, attempt: str) -> list[Statement]:
        """The run is over: every write still waiting; the attempt is forgotten."""
        if attempt not in self._runs:
            return []
        with self._lock:
            run = self._runs.pop(attempt, None)
            if run is None:
                return []
            return [st for key in list(run.pending) for st in self._pop(run, key)]

    def take_thread(self, thread_id: str, checkpoint_ns: str | None = None) -> list[Statement]:
        """Every write waiting on the thread (in ``checkpoint_ns`` only, if given)."""
        if not self._runs:
            return []
        taken: list[Statement] = []
        with self._lock:
            for run in self._runs.values():
                if run.thread_id != thread_id:
                    continue
                for key in [k for k in run.pending if checkpoint_ns in (None, k[0])]:
                    taken.extend(self._pop(run, key))
        return taken

    def close(self) -> None:
        self._timer.close()

    @staticmethod
    def _pop(run: _Run, key: Key) -> list[Statement]:
        run.due.pop(key, None)
        if (timer := run.timers.pop(key, None)) is not None:
            timer.cancel()  # from another thread too: a stale fire finds nothing
        return run.pending.pop(key, [])

    def _expired(self, attempt: str, key: Key, waiter: Waiter) -> list[Statement]:
        with self._lock:
            run = self._runs.get(attempt)
            if run is None or key not in run.pending or run.due[key] > time.monotonic():
                return []
            run.timers.pop(key, None)
            run.flushing[key] = waiter
            run.due.pop(key)
            return run.pending.pop(key)

    def _done(self, attempt: str, key: Key) -> None:
        with self._lock:
            run = self._runs.get(attempt)
            if run is not None:
                run.flushing.pop(key, None)

    def _next_due(self) -> float | None:
        with self._lock:
            return min(
                (due for run in self._runs.values() if run.sync for due in run.due.values()),
                default=None,
            )

    def _fire_expired(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [
                (attempt, key)
                for attempt, run in self._runs.items()
                if run.sync
                for key, due in run.due.items()
                if due <= now
            ]
        for attempt, key in expired:
            self._fire(attempt, key)

    def _fire(self, attempt: str, key: Key) -> None:
        """The sync run's window ended (timer thread)."""
        event = threading.Event()
        if not (statements := self._expired(attempt, key, event)):
            return
        try:
            self._store(statements)
        except Exception:
            _lost(len(statements))
        finally:
            self._done(attempt, key)
            event.set()

    def _afire(self, attempt: str, key: Key) -> None:
        """The async run's window ended (a callback on its event loop)."""
        done = asyncio.get_running_loop().create_future()
        if not (statements := self._expired(attempt, key, done)):
            return

        async def store() -> None:
            try:
                await self._astore(statements)
            except Exception:
                _lost(len(statements))
            finally:
                self._done(attempt, key)
                done.set_result(None)

        task = asyncio.ensure_future(store())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)


_TASKS: set[asyncio.Future[None]] = set()  # timed stores in flight (keep a reference)


def store_leftovers(statements: Sequence[Statement]) -> Operation[None]:
    """Before a read of a thread: store the writes still waiting there for their put. They
    may be another attempt's that has since been fenced (interrupted or rolled back by a
    newer run, taken over): the guard then refuses them, rightly, and the read goes on
    without them - they are dropped as that attempt's next write would have been."""
    try:
        yield Batch.write(*statements)
    except psycopg.Error as exc:
        if exc.sqlstate not in SQLSTATES:
            raise
        logger.info(
            "langgraph-deterministic: %d pending write(s) of a fenced attempt dropped "
            "(%s: %s).",
            len(statements),
            exc.sqlstate,
            exc.diag.message_primary,
        )


def _lost(count: int) -> None:
    logger.warning(
        "langgraph-deterministic: %d pending write(s) of a finished task could not be "
        "stored; that task runs again on a retry.",
        count,
        exc_info=True,
    )


class _TimerThread:
    """One daemon thread per saver storing the sync runs' writes whose window ended. It
    sleeps until the earliest deadline of the writes still waiting (writes taken by
    their put drop out, so it wakes about once per window while runs are busy, not once
    per superstep), ends when idle, and starts again when needed."""

    def __init__(self, next_due: Callable[[], float | None], fire: Callable[[], None]) -> None:
        self._next_due, self._fire = next_due, fire
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._idle = False
        self._closed = False

    def kick(self) -> None:
        """A sync run's write started waiting (its deadline is the latest so far)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="langgraph-deterministic-writes", daemon=True
                )
                self._thread.start()
            elif self._idle:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    self._thread = None
                    return
                due = self._next_due()
                if due is None:
                    self._idle = True
                    woken = self._cond.wait(1.0)
                    self._idle = False
                    if not woken and self._next_due() is None:
                        self._thread = None  # idle: kick() starts a new one
                        return
                    continue
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
            self._fire()
