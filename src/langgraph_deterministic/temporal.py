"""Run a LangGraph graph call inside a Temporal activity, safely (extra ``[temporal]``).

One activity runs one graph call (one turn of a conversation, one step of a pipeline).
:func:`run_graph` (async activities) and :func:`run_graph_sync` (sync activities on a
thread pool) do what the call needs under Temporal's retries:

* the run id is ``f"{workflow_id}:{step}"`` (:func:`activity_run_id`): ``step`` is a key
  the workflow passes in the activity's arguments, the same on every retry of the
  activity and different for every turn. Not the activity's name (it repeats every turn:
  turn 2 would reuse turn 1's run id and get ``RunInputMismatchError``), not Temporal's run
  id or the attempt number (they change on retry, so a retry would apply its input again);
* a background heartbeat while the graph runs, durable ops included, every
  ``heartbeat_timeout / 4``, so a dead or frozen worker is noticed after the activity's
  heartbeat timeout and the activity retried elsewhere; the saver's ``lease_ttl`` must be
  at least that timeout (checked), so the thread stays held for as long as Temporal
  counts the attempt as alive;
* ``durability="sync"``: an attempt fenced off by the retry stops at its next superstep;
* our errors become ``ApplicationError(non_retryable=not is_retryable(exc))`` with our
  message and the class name as ``type``: a permanent contract error (a reused run id with
  another input, a missing run id, an unfinished previous run) fails the activity at once,
  a transient one (another attempt or run holds the thread, the database is down) is
  retried by the activity's retry policy. Any other exception is left to that policy;
* a worker frozen past the heartbeat timeout and thawed (a zombie) learns at its next
  heartbeat that its attempt is gone and gets the SDK's cancellation: an async activity is
  cancelled where it awaits, a sync one finishes the superstep it is in (the retry's
  fencing stops it there) and then raises ``CancelledError``. Either way nothing it
  writes after the retry took over is stored;
* a previous run on the thread whose worker died (its lease expired: a workflow
  terminated mid-turn, a workflow per message) is finished first, then this one runs;
* ``journal=True`` (or a ``PostgresJournal``): the graph runs under
  ``DeterministicRunner``, so a retry does not run again a durable op that had finished.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from langgraph_deterministic._orchestration import (
    ainvoke_finishing_first,
    invoke_finishing_first,
    prepare,
)
from langgraph_deterministic.checkpointer.contract import MultitaskStrategy
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConfigurationError,
    DeterministicError,
    MissingExtraError,
    is_retryable,
)

try:
    from temporalio import activity
    from temporalio.exceptions import ApplicationError
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise MissingExtraError(
        f"langgraph_deterministic.temporal needs temporalio ({exc}). Fix: pip install "
        "'langgraph-deterministic[temporal]'."
    ) from exc

__all__ = [
    "DEFAULT_HEARTBEAT_EVERY",
    "activity_run_id",
    "check_heartbeat_timeout",
    "heartbeating",
    "heartbeating_sync",
    "run_graph",
    "run_graph_sync",
    "temporal_errors",
    "to_application_error",
]

DEFAULT_HEARTBEAT_EVERY = 5.0
"""Seconds between heartbeats when the activity has no heartbeat timeout."""


def activity_run_id(step: str) -> str:
    """The run id of this activity's graph call: ``f"{workflow_id}:{step}"``.

    ``step`` names the turn or step (``"turn-3"``, a message id, ``"triage"`` in a
    one-shot pipeline): the workflow passes it in the activity's arguments, so it is the
    same on every retry of the activity and new for new work. Temporal's workflow id
    stays the same across retries and continue-as-new; its run id and the attempt number
    do not.
    """
    if not isinstance(step, str) or not step.strip():
        raise ConfigurationError(
            f"activity_run_id needs a step: a non-empty str naming this turn, passed by the "
            f"workflow in the activity's arguments (e.g. f'turn-{{n}}'), got {step!r}. Not "
            "the activity's name: it repeats on every turn."
        )
    return f"{activity.info().workflow_id}:{step}"


def _heartbeat_timeout() -> float | None:
    timeout = activity.info().heartbeat_timeout
    return timeout.total_seconds() if timeout else None


def _interval(every: float | None) -> float:
    if every is not None:
        if not every > 0:
            raise ConfigurationError(f"heartbeat_every must be > 0 seconds, got {every!r}.")
        return float(every)
    timeout = _heartbeat_timeout()
    return timeout / 4 if timeout else DEFAULT_HEARTBEAT_EVERY


def check_heartbeat_timeout(saver: Any) -> None:
    """Refuse a saver whose ``lease_ttl`` is shorter than the activity's heartbeat timeout.

    Temporal counts an attempt as alive until its heartbeat timeout passes; the saver
    holds the thread for ``lease_ttl`` after the last sign of life. With a shorter lease,
    a worker paused for longer than ``lease_ttl`` (a GC pause, a stalled node) but less
    than the heartbeat timeout loses the thread while Temporal still waits for it: a run
    from elsewhere finds the run unfinished. A retry of the activity never waits for the
    lease (a retry of the same run takes it over).
    """
    timeout = _heartbeat_timeout()
    ttl = getattr(saver, "lease_ttl", None)
    if timeout is not None and ttl is not None and ttl < timeout:
        raise ConfigurationError(
            f"the saver's lease_ttl ({ttl:g} s) is shorter than this activity's heartbeat "
            f"timeout ({timeout:g} s). Fix: DeterministicSaver(..., lease_ttl={timeout:g}) or "
            "more, or a shorter heartbeat_timeout in execute_activity."
        )


def to_application_error(exc: DeterministicError) -> ApplicationError:
    """Our error as a Temporal failure: our message, the class name as ``type``,
    ``non_retryable`` when retrying the same call cannot succeed."""
    return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=not is_retryable(exc))


@contextmanager
def temporal_errors() -> Iterator[None]:
    """Turn our errors raised inside the block into ``ApplicationError`` (see
    :func:`to_application_error`); everything else passes through."""
    try:
        yield
    except DeterministicError as exc:
        raise to_application_error(exc) from exc


@asynccontextmanager
async def heartbeating(every: float | None = None) -> AsyncIterator[None]:
    """Heartbeat from a background task while the block runs (async activities).

    The task runs on the activity's event loop: keep blocking code in threads (LangGraph
    runs sync nodes in its thread pool; use ``asyncio.to_thread`` for blocking calls
    inside async nodes) or the heartbeats stop and Temporal retries the activity."""
    interval = _interval(every)

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        task.cancel()  # not awaited: that could swallow a cancellation of the activity


@contextmanager
def heartbeating_sync(every: float | None = None) -> Iterator[None]:
    """Heartbeat from a background thread while the block runs (sync activities)."""
    interval = _interval(every)
    context = contextvars.copy_context()  # the activity's context, for activity.heartbeat
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            context.run(activity.heartbeat)
            stop.wait(interval)

    thread = threading.Thread(target=beat, name="lgd-temporal-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _prepare(graph: Any, kwargs: dict[str, Any], journal: Any) -> Any:
    runner = prepare(graph, kwargs, journal, "run_graph")
    check_heartbeat_timeout(graph.checkpointer)
    return runner


async def run_graph(
    graph: Any,
    input: Any,
    *,
    thread_id: str,
    step: str,
    journal: Any = False,
    heartbeat_every: float | None = None,
    multitask_strategy: MultitaskStrategy | None = None,
    **kwargs: Any,
) -> Any:
    """Run one graph call in an async activity; see the module docstring.

    ``graph`` is compiled with a ``DeterministicSaver``; ``thread_id`` names the
    conversation; ``step`` the turn (see :func:`activity_run_id`). ``journal``: ``True``
    journals the graph's durable ops in the saver's database (``PostgresJournal``), or
    pass a journal. ``multitask_strategy`` goes to ``run_config``; other keyword arguments
    to ``ainvoke`` (``durability`` is ``"sync"``).
    """
    with temporal_errors():
        runner = _prepare(graph, kwargs, journal)
        config = run_config(thread_id, activity_run_id(step), multitask_strategy=multitask_strategy)
        async with heartbeating(heartbeat_every):
            return await ainvoke_finishing_first(graph, runner, input, config, kwargs)


def run_graph_sync(
    graph: Any,
    input: Any,
    *,
    thread_id: str,
    step: str,
    journal: Any = False,
    heartbeat_every: float | None = None,
    multitask_strategy: MultitaskStrategy | None = None,
    **kwargs: Any,
) -> Any:
    """:func:`run_graph` for a sync activity (a worker with an ``activity_executor``).

    The SDK cancels a sync activity by raising ``CancelledError`` in its thread; the graph
    call is shielded from that (an exception raised inside a database call could leave a
    pooled connection half-used) and the cancellation is raised when the call returns.
    A zombie whose attempt was retried elsewhere stops before that, at its next
    superstep: the retry's fencing refuses its next checkpoint."""
    with temporal_errors():
        runner = _prepare(graph, kwargs, journal)
        config = run_config(thread_id, activity_run_id(step), multitask_strategy=multitask_strategy)
        with heartbeating_sync(heartbeat_every), activity.shield_thread_cancel_exception():
            return invoke_finishing_first(graph, runner, input, config, kwargs)
