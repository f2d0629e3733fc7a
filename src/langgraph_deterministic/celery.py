"""Run a LangGraph graph call inside a Celery task, safely (extra ``[celery]``).

One task runs one graph call. :func:`run_graph_task` does what the call needs under
Celery's at-least-once delivery:

* the run id is the task id (``self.request.id``): the same on every redelivery of the
  message (a lost worker, a visibility timeout) and on every ``self.retry()``. Pass
  ``run_id=`` a business key instead when the *producer* may publish the same turn twice
  (a web handler retried by its client, an outbox relayed twice): two publishes are two
  task ids, so with the task id the turn would run twice; with a key derived from the turn
  (a message id) the second is a retry of the first;
* ``durability="sync"``: an attempt fenced off by another delivery stops at its next
  superstep;
* our transient errors (another delivery or run holds the thread, the database is down)
  become ``self.retry()`` with exponential backoff; before a retry runs the graph again it
  waits while another attempt of the same run still holds the thread's lease, so a second
  delivery never takes a run over from a live worker (a dead or frozen one loses its lease
  after ``lease_ttl``). A previous run on the thread whose worker died (its lease
  expired) is finished first, then this one runs: a whole-worker kill costs the next turn
  about ``lease_ttl``, not the broker's visibility timeout. Permanent errors (a reused run
  id with another input, a previous run that raised) fail the task at once with our
  message. Any other exception is the task's own business (``autoretry_for`` ...);
* the saver (and whatever else holds connections) is opened per worker process, after
  the fork, by :class:`WorkerLocal`: a prefork pool's children never share the parent's
  sockets.

The settings that make redelivery happen, and why: docs/how-to/celery.md.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from langgraph_deterministic._orchestration import (
    backoff,
    invoke_finishing_first,
    prepare,
    retry_delay,
)
from langgraph_deterministic.checkpointer.contract import MultitaskStrategy
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DeterministicError,
    MissingExtraError,
    is_retryable,
)

try:
    from celery import signals
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise MissingExtraError(
        f"langgraph_deterministic.celery needs celery ({exc}). Fix: pip install "
        "'langgraph-deterministic[celery]'."
    ) from exc

__all__ = ["WorkerLocal", "retry_countdown", "run_graph_task", "worker_saver"]

T = TypeVar("T")

_LOCALS: list[WorkerLocal[Any]] = []


class WorkerLocal(Generic[T]):
    """One object per worker process, built on first use in that process.

    ``saver = WorkerLocal(lambda: DeterministicSaver(DSN))`` at module level, then
    ``saver.get()`` inside tasks. A prefork pool forks its children from the process that
    imported the tasks: connections opened before the fork would be shared by every child
    (one socket, many writers). Here each process builds its own object the first time it
    asks; an object inherited through a fork is never used, closed or garbage-collected in
    the child (closing it there would end the parent's connections). Objects with
    ``close()`` are closed when the worker process shuts down.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._value: T | None = None
        self._inherited: list[T] = []  # kept alive, never touched: they belong to the parent
        _LOCALS.append(self)

    def get(self) -> T:
        """This process's object: built by the factory on the first call in this process
        (after a fork, the parent's object is set aside untouched and a new one built),
        the same object on every later call. Thread-safe: two threads of one process
        asking first get one object."""
        pid = os.getpid()
        if self._pid == pid and self._value is not None:
            return self._value
        with self._lock:
            if self._pid != pid:
                if self._value is not None:
                    self._inherited.append(self._value)
                self._value, self._pid = None, pid
            if self._value is None:
                self._value = self._factory()
            return self._value

    def close(self) -> None:
        """Close this process's object (if it was built here and has ``close()``)."""
        with self._lock:
            value, mine = self._value, self._pid == os.getpid()
            self._value = None
        close = getattr(value, "close", None)
        if mine and callable(close):
            close()


def worker_saver(conn: str, **saver_kwargs: Any) -> WorkerLocal[Any]:
    """A :class:`WorkerLocal` ``DeterministicSaver`` for ``conn`` (a DSN), opened per
    worker process. Keyword arguments go to ``DeterministicSaver``."""
    from langgraph_deterministic.checkpointer.saver import DeterministicSaver

    if not isinstance(conn, str):
        raise ConfigurationError(
            "worker_saver needs a DSN: a pool or connection built before the fork would be "
            "shared by every worker process. Fix: pass the DSN, or build the pool inside "
            "WorkerLocal(lambda: DeterministicSaver(ConnectionPool(dsn)))."
        )
    return WorkerLocal(lambda: DeterministicSaver(conn, **saver_kwargs).__enter__())


def _close_all(**_: Any) -> None:
    for local in list(_LOCALS):
        with contextlib.suppress(Exception):  # shutting down: nobody to report it to
            local.close()


signals.worker_process_shutdown.connect(_close_all, weak=False)
atexit.register(_close_all)


def retry_countdown(retries: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds before retry number ``retries + 1``: ``retry.backoff(retries + 1)``, the one
    backoff of the package (``base * 2**retries``, at most ``cap``)."""
    return backoff(retries + 1, base=base, cap=cap)


def _other_attempt_live(saver: Any, thread_id: str, run_id: str) -> float | None:
    """Seconds until the lease of another live attempt of this run expires, else None."""
    record = saver.get_run(thread_id, run_id)
    lease = None if record is None else record.lease
    if lease is None or lease.run_id != run_id:
        return None
    now = _dt.datetime.now(_dt.UTC)
    if not lease.live(now):
        return None
    return max(0.1, float((lease.expires_at - now).total_seconds()))


def run_graph_task(
    task: Any,
    graph: Any,
    input: Any,
    *,
    thread_id: str,
    run_id: str | None = None,
    journal: Any = False,
    multitask_strategy: MultitaskStrategy | None = None,
    countdown: Callable[[int], float] = retry_countdown,
    **kwargs: Any,
) -> Any:
    """Run one graph call in a bound Celery task (``@app.task(bind=True)``).

    ``task`` is the task's ``self``; ``graph`` is compiled with a ``DeterministicSaver``
    (one per worker process: :func:`worker_saver`). ``run_id`` defaults to the task id.
    ``journal=True`` runs the graph under ``DeterministicRunner(PostgresJournal(saver))``
    (or pass a journal). ``countdown(retries)`` spaces the retries of transient errors;
    the task's ``max_retries`` bounds them, after which the error is raised. Other keyword
    arguments go to ``invoke``.
    """
    runner = prepare(graph, kwargs, journal, "run_graph_task", "worker_saver(dsn).get()")
    saver = graph.checkpointer
    request = task.request
    run_id = run_id or request.id
    if not run_id:
        raise ConfigurationError(
            "run_graph_task found no task id: call it from a bound task "
            "(@app.task(bind=True)) and pass the task's self, or pass run_id=."
        )
    retries = int(getattr(request, "retries", 0) or 0)
    if retries:
        # A retry we asked for after a transient error: if another attempt of this run
        # (a twin delivery) is still alive, let it finish instead of taking it over.
        wait = _other_attempt_live(saver, thread_id, run_id)
        if wait is not None:
            raise task.retry(
                exc=ConcurrentRunError(
                    f"another attempt of run {run_id!r} holds thread {thread_id!r} (its "
                    f"lease ends in {wait:.1f} s); retrying after it."
                ),
                countdown=wait,
            )
    config = run_config(thread_id, run_id, multitask_strategy=multitask_strategy)
    try:
        return invoke_finishing_first(graph, runner, input, config, kwargs)
    except DeterministicError as exc:
        if is_retryable(exc):
            wait = retry_delay(exc, retries + 1, lambda attempt: countdown(attempt - 1))
            raise task.retry(exc=exc, countdown=wait) from exc
        raise
