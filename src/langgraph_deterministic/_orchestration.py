"""What the integration modules share (Celery's ``run_graph_task``, Temporal's
``run_graph``, the retry loop's ``invoke_with_retries``): the checks before a graph call
(a ``DeterministicSaver``, ``durability="sync"``, the runner for ``journal=``), the retry
delay of a transient error, and finishing first a run whose worker died.

Finishing first. A worker killed as a whole (SIGKILL, OOM, a node lost) leaves its run
unfinished: its run id and input are recorded (the ledger, the run's first checkpoint)
and its lease expires after ``lease_ttl``. The next run on the thread is then refused
(``RunUnfinishedError``) until the orchestrator redelivers the dead run, which under
Celery's redis transport is the visibility timeout, an hour by default. Instead the next
call continues the dead run itself, ``invoke(None, run_config(thread_id, dead_run))``
(LangGraph continues from the latest checkpoint; the saver accepts a ``None`` input as a
retry of any run the thread has seen), then runs its own turn. The late redelivery finds
its run finished and returns its result without running (the ledger's ``done``). This
lives here, not in the saver: the saver is called from inside LangGraph's loop, knows no
graph (one saver serves many) and no runner (a journaled run's durable ops need one), so
only the caller that holds the graph can run the dead run's remaining steps.

Only a run whose worker *died* is finished this way: a run that raised (a node's error)
would most likely raise again, so it stays the caller's decision (the error names how).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConfigurationError,
    RunUnfinishedError,
    ThreadBusyError,
)

T = TypeVar("T")

#: How many dead runs one call finishes before its own at most (each finish moves the
#: thread on; more in a row means runs are being killed as fast as they start).
MAX_FINISHES = 3


def backoff(attempt: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...):
    ``base * 2**(attempt - 1)``, at most ``cap``."""
    return float(min(cap, base * 2 ** min(max(attempt - 1, 0), 30)))


def retry_delay(exc: BaseException, attempt: int, delay: Callable[[int], float] = backoff) -> float:
    """``delay(attempt)``, but no later than just after the holder's lease ends when the
    thread is busy: a dead holder's thread is free (or its run finishable) then, a live
    holder has renewed its lease and the retry finds it busy again, one admission later."""
    wait = delay(attempt)
    expires = getattr(exc, "lease_expires_at", None) if isinstance(exc, ThreadBusyError) else None
    if isinstance(expires, _dt.datetime):
        left = (expires - _dt.datetime.now(_dt.UTC)).total_seconds() + 0.05
        wait = min(wait, max(0.05, left))
    return wait


def prepare(
    graph: Any,
    kwargs: dict[str, Any],
    journal: Any,
    who: str,
    saver_fix: str = "DeterministicSaver(dsn)",
) -> Any:
    """Check what a graph call of ``who`` needs and return its DeterministicRunner (for
    ``journal=True`` or a journal) or None. Sets ``durability="sync"`` in ``kwargs``."""
    from langgraph_deterministic.checkpointer.saver import DeterministicSaver

    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, DeterministicSaver):
        raise ConfigurationError(
            f"{who} needs a graph compiled with a DeterministicSaver, got checkpointer "
            f"{type(saver).__name__}. Fix: builder.compile(checkpointer={saver_fix})."
        )
    durability = kwargs.setdefault("durability", "sync")
    if durability != "sync":
        raise ConfigurationError(
            f"{who} runs with durability='sync' (an attempt fenced off by another attempt "
            f"of its run stops at its next superstep), got {durability!r}. Fix: leave "
            "durability out."
        )
    return runner_for(saver, journal)


def runner_for(saver: Any, journal: Any) -> Any:
    if journal is True:
        from langgraph_deterministic.runner import PostgresJournal

        journal = PostgresJournal(saver)
    if journal is None or journal is False:
        return None
    from langgraph_deterministic.runner import DeterministicRunner

    return DeterministicRunner(journal=journal)


def _dead_run(exc: RunUnfinishedError, run_id: str) -> str | None:
    dead = exc.unfinished_run_id
    return dead if exc.died and dead is not None and dead != run_id else None


def _finisher(graph: Any, runner: Any, exc: RunUnfinishedError) -> Any:
    """The runner that continues the dead run: ours, or one on the saver's journal when
    the dead run was journaled and this call is not (its durable ops need a runner)."""
    if runner is None and exc.journaled:
        return runner_for(graph.checkpointer, True)
    return runner


def invoke_finishing_first(
    graph: Any,
    runner: Any,
    input: Any,
    config: Any,
    kwargs: dict[str, Any],
    on_finish: Callable[[str], None] | None = None,
) -> Any:
    """``graph.invoke`` (or ``runner.invoke``); first finishing a run whose worker died."""
    thread_id, run_id = _ids(config)
    for finished in range(MAX_FINISHES + 1):
        try:
            return _call(graph, runner, input, config, kwargs)
        except RunUnfinishedError as exc:
            dead = _dead_run(exc, run_id)
            if dead is None or finished == MAX_FINISHES:
                raise
            if on_finish is not None:
                on_finish(dead)
            _call(graph, _finisher(graph, runner, exc), None, run_config(thread_id, dead), kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


async def ainvoke_finishing_first(
    graph: Any,
    runner: Any,
    input: Any,
    config: Any,
    kwargs: dict[str, Any],
    on_finish: Callable[[str], None] | None = None,
) -> Any:
    """Async :func:`invoke_finishing_first`."""
    thread_id, run_id = _ids(config)
    for finished in range(MAX_FINISHES + 1):
        try:
            return await _acall(graph, runner, input, config, kwargs)
        except RunUnfinishedError as exc:
            dead = _dead_run(exc, run_id)
            if dead is None or finished == MAX_FINISHES:
                raise
            if on_finish is not None:
                on_finish(dead)
            await _acall(
                graph, _finisher(graph, runner, exc), None, run_config(thread_id, dead), kwargs
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _ids(config: Any) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable["run_id"])


def _call(graph: Any, runner: Any, input: Any, config: Any, kwargs: dict[str, Any]) -> Any:
    if runner is not None:
        return runner.invoke(graph, input, config, **kwargs)
    return graph.invoke(input, config, **kwargs)


def _acall(
    graph: Any, runner: Any, input: Any, config: Any, kwargs: dict[str, Any]
) -> Awaitable[Any]:
    if runner is not None:
        return runner.ainvoke(graph, input, config, **kwargs)  # type: ignore[no-any-return]
    return graph.ainvoke(input, config, **kwargs)  # type: ignore[no-any-return]
