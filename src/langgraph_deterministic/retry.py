"""Retry a graph call without an orchestrator: a plain loop, a cron job, a Kubernetes Job.

The run id must come from outside the process (a job's name, a message id, a key in the
job's spec), so that a restarted pod resumes the same run instead of starting a new one.
Inside the process, :func:`invoke_with_retries` makes the graph call and retries what
:func:`is_retryable` calls transient (another attempt or run holds the thread, the
database is down) with backoff, raising everything else at once; a previous run on the
thread whose process died it finishes first. :func:`call_with_retries` retries any call
of yours the same way. A Kubernetes Job ends the process with
:func:`exit_code`: ``EXIT_TRANSIENT`` (75, ``EX_TEMPFAIL``) lets the Job's ``backoffLimit``
restart the pod, anything else can end the Job through a ``podFailurePolicy``
(docs/how-to/retry-loops.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langgraph_deterministic._orchestration import (
    ainvoke_finishing_first,
    backoff,
    invoke_finishing_first,
    prepare,
    retry_delay,
)
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import is_retryable

__all__ = [
    "EXIT_PERMANENT",
    "EXIT_TRANSIENT",
    "acall_with_retries",
    "ainvoke_with_retries",
    "backoff",
    "call_with_retries",
    "exit_code",
    "invoke_with_retries",
]

T = TypeVar("T")

EXIT_TRANSIENT = 75
"""Exit code of a process whose graph call failed transiently (``EX_TEMPFAIL``)."""
EXIT_PERMANENT = 3
"""Exit code of a process whose graph call failed for good (retrying cannot help)."""


def call_with_retries(
    fn: Callable[[], T],
    *,
    attempts: int = 8,
    delay: Callable[[int], float] = backoff,
    retry_if: Callable[[BaseException], bool] = is_retryable,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """``fn()``, called again after an exception ``retry_if`` accepts (by default our
    transient errors), at most ``attempts`` times in all; the last error is raised.
    ``delay(attempt)`` spaces the attempts; a busy thread (``ThreadBusyError``) is tried
    again no later than just after its holder's lease ends."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts!r}")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not retry_if(exc):
                raise
            sleep(retry_delay(exc, attempt, delay))
    raise AssertionError("unreachable")  # pragma: no cover


async def acall_with_retries(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int = 8,
    delay: Callable[[int], float] = backoff,
    retry_if: Callable[[BaseException], bool] = is_retryable,
) -> T:
    """Async :func:`call_with_retries`: ``await fn()``."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts!r}")
    for attempt in range(1, attempts + 1):
        try:
            return await fn()
        except Exception as exc:
            if attempt == attempts or not retry_if(exc):
                raise
            await asyncio.sleep(retry_delay(exc, attempt, delay))
    raise AssertionError("unreachable")  # pragma: no cover


def invoke_with_retries(
    graph: Any,
    input: Any,
    *,
    thread_id: str,
    run_id: str,
    journal: Any = False,
    attempts: int = 8,
    delay: Callable[[int], float] = backoff,
    retry_if: Callable[[BaseException], bool] = is_retryable,
    sleep: Callable[[float], Any] = time.sleep,
    **kwargs: Any,
) -> Any:
    """One graph call (``run_config(thread_id, run_id)``, ``durability="sync"``) retried as
    :func:`call_with_retries` does, finishing first a previous run on the thread whose
    worker died (a killed pod's): the next call on the thread recovers it within the
    saver's ``lease_ttl`` instead of being refused with ``RunUnfinishedError``.
    ``journal=True`` runs the graph under ``DeterministicRunner(PostgresJournal(saver))``
    (or pass a journal); other keyword arguments go to ``invoke``."""
    runner = prepare(graph, kwargs, journal, "invoke_with_retries")
    config = run_config(thread_id, run_id)
    return call_with_retries(
        lambda: invoke_finishing_first(graph, runner, input, config, kwargs),
        attempts=attempts, delay=delay, retry_if=retry_if, sleep=sleep,
    )  # fmt: skip


async def ainvoke_with_retries(
    graph: Any,
    input: Any,
    *,
    thread_id: str,
    run_id: str,
    journal: Any = False,
    attempts: int = 8,
    delay: Callable[[int], float] = backoff,
    retry_if: Callable[[BaseException], bool] = is_retryable,
    **kwargs: Any,
) -> Any:
    """Async :func:`invoke_with_retries`: ``ainvoke`` (or ``runner.ainvoke``)."""
    runner = prepare(graph, kwargs, journal, "ainvoke_with_retries")
    config = run_config(thread_id, run_id)
    return await acall_with_retries(
        lambda: ainvoke_finishing_first(graph, runner, input, config, kwargs),
        attempts=attempts, delay=delay, retry_if=retry_if,
    )  # fmt: skip


def exit_code(exc: BaseException | None) -> int:
    """The exit code for a job process: 0 (no error), :data:`EXIT_TRANSIENT` for an error
    a later attempt of the same run can get past, :data:`EXIT_PERMANENT` otherwise."""
    if exc is None:
        return 0
    return EXIT_TRANSIENT if is_retryable(exc) else EXIT_PERMANENT
