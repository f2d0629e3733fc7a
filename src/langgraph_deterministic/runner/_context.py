"""Per-task identity and the ``durable()`` entry point.

Every durable op gets a key that is the same on every execution of the same run:

    <task key> / <innermost node>@<step> : <op name> # <n>

* The *task key* is composed by the runner's submit hook as tasks start: the parent's key,
  then ``<task name>@<step>`` plus the task's path for Send (push) tasks. Subgraphs run
  inside a parent task, so their keys nest under it.
* Tasks that LangGraph runs inline (a superstep with a single task) keep their parent's
  task key; the innermost node name and step (from the config LangGraph runs the node
  with) still tell their ops apart.
* ``n`` counts ops of that name in that task, so a node may run several ops of one name
  one after another, and ops of *different* names concurrently (``asyncio.gather``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from langgraph_deterministic._compat.langgraph import var_child_runnable_config

from ._ordering import NondeterminismError, OpScheduler

T = TypeVar("T")


class KeyedSession(Protocol):
    """One run of a keyed journal: ops are addressed by key, so they need no ordering."""

    async def arun_op(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any: ...  # fmt: skip

    def run_op(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any: ...  # fmt: skip


@dataclass
class TaskScope:
    """Identity of the task code is running in, plus its op counters."""

    key: str
    counters: dict[str, int] = field(default_factory=dict)
    # op name -> the asyncio tasks with an op of that name in flight (and how many)
    holders: dict[str, dict[asyncio.Task[Any], int]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
    """A durable op that runs ``fn(*args, **kwargs)`` once and journals its result."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: Any = None
    context: contextvars.Context | None = None  # the requesting task's, to run fn in


@dataclass(frozen=True)
class SleepSpec:
    """A durable timer."""

    seconds: float


_SCHEDULER: ContextVar[OpScheduler[Any] | None] = ContextVar("lgd_scheduler", default=None)
# A keyed journal's session (PostgresJournal): ops go straight to it, no ordering needed.
_KEYED: ContextVar[KeyedSession | None] = ContextVar("lgd_keyed_session", default=None)
# The idempotency key of the op whose function is running (see idempotency_key()).
_IDEMPOTENCY_KEY: ContextVar[str | None] = ContextVar("lgd_idempotency_key", default=None)
_SCOPE: ContextVar[TaskScope | None] = ContextVar("lgd_task_scope", default=None)
# Set while a journal executes an op's function: durable ops may not nest.
IN_OP: ContextVar[str | None] = ContextVar("lgd_in_op", default=None)


def current_scheduler() -> OpScheduler[Any] | None:
    return _SCHEDULER.get()


def _innermost_node() -> str:
    cfg = var_child_runnable_config.get()
    if not cfg:
        return ""
    md = cfg.get("metadata") or {}
    node = md.get("langgraph_node")
    step = md.get("langgraph_step")
    if node is None:
        return ""
    return f"{node}@{step}"


def _local_name(name: str) -> str:
    inner = _innermost_node()
    return f"{inner}:{name}" if inner else name


def op_key(name: str) -> str:
    """The replay-stable key of the next op called ``name`` in the current task."""
    scope = _SCOPE.get()
    if scope is None:
        scope = TaskScope("run")
        _SCOPE.set(scope)
    local = _local_name(name)
    n = scope.counters.get(local, 0)
    scope.counters[local] = n + 1
    return f"{scope.key}/{local}#{n}"


def request(spec: RunSpec | SleepSpec, name: str) -> asyncio.Future[Any] | None:
    """Route ``spec`` to the active runner; ``None`` outside a runner."""
    sched = _SCHEDULER.get()
    if sched is None:
        return None
    outer = IN_OP.get()
    if outer is not None:
        raise NondeterminismError(
            f"durable op {name!r} was started inside durable op {outer!r}. The outer op's "
            "result is journaled, so on replay its function does not run and the inner op "
            "would never be asked for. Fix: call the inner op from the node, next to the "
            "outer one, not from inside its function."
        )
    key = op_key(name)
    scope = _SCOPE.get()
    task = asyncio.current_task()
    local = _local_name(name)
    if scope is None or task is None:  # pragma: no cover - op_key set the scope
        return sched.request(key, spec)
    holders = scope.holders.setdefault(local, {})
    if any(t is not task for t in holders) and not _requests_first(task):
        raise NondeterminismError(
            f"durable op {key!r} was requested while another coroutine of the same task has "
            f"an op named {name!r} in flight. Ops of one name are numbered in the order they "
            "are asked for, and concurrent coroutines (asyncio.gather, create_task) ask in an "
            "order that changes on replay, which would hand them each other's results. Fix: "
            f"give concurrent ops distinct names, e.g. durable(f'{name}:{{item}}', ...)."
        )
    fut = sched.request(key, spec)
    holders[task] = holders.get(task, 0) + 1

    def release(_: asyncio.Future[Any]) -> None:
        left = holders.get(task, 0) - 1
        if left > 0:
            holders[task] = left
        else:
            holders.pop(task, None)

    fut.add_done_callback(release)
    return fut


def _requests_first(task: asyncio.Task[Any]) -> bool:
    """True if ``task`` is a bare ``durable(...)`` coroutine (``asyncio.gather(durable(..),
    durable(..))``): it asks for its op in its first step, so in creation order."""
    return getattr(task.get_coro(), "cr_code", None) is _DURABLE_CODE


async def durable(name: str, fn: Callable[..., T] | Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` as a durable op of the active runner.

    Inside ``DeterministicRunner.ainvoke``/``astream`` the call is journaled once, in an
    order that replays identically; on replay the journaled result (or failure) is
    returned without calling ``fn``. Outside a runner, ``fn`` is simply called (and
    awaited if it returns an awaitable), so nodes stay testable without a journal.

    ``name`` must be stable across executions; concurrent ops in one task need distinct
    names (``durable(f"fetch:{url}", fetch, url)``).
    """
    session = _KEYED.get()
    if session is not None:
        keyed: T = await session.arun_op(name, fn, args, kwargs)
        return keyed
    if _SCHEDULER.get() is not None:
        fn = _with_idempotency_key(fn, name)
    fut = request(RunSpec(name, fn, args, kwargs, None, contextvars.copy_context()), name)
    if fut is None:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            awaited: T = await result
            return awaited
        return result
    value: T = await fut
    return value


_DURABLE_CODE = durable.__code__


def durable_sync(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """:func:`durable` for sync nodes (``runner.invoke`` / ``runner.stream``).

    Under a keyed journal (``PostgresJournal``) the op is journaled like ``durable``'s;
    outside a runner ``fn`` is simply called. The ordered (Restate) journal runs async
    handlers only: there, use ``await durable(...)`` in async nodes.
    """
    session = _KEYED.get()
    if session is not None:
        value: T = session.run_op(name, fn, args, kwargs)
        return value
    if _SCHEDULER.get() is not None:
        from langgraph_deterministic.errors import ConfigurationError

        raise ConfigurationError(
            f"durable_sync({name!r}) was called in a run on an ordered journal (Restate), "
            "which journals ops from async code only. Fix: make the node async and use "
            f"await durable({name!r}, ...)."
        )
    return fn(*args, **kwargs)


def idempotency_key() -> str:
    """The stable idempotency key of the durable op whose function is running.

    The same on every execution of the op (a retry in another process included) and
    different for every other op: pass it to APIs that deduplicate requests (a payment
    provider's ``Idempotency-Key``), so an op re-run after a crash acts once.
    """
    key = _IDEMPOTENCY_KEY.get()
    if key is None:
        from langgraph_deterministic.errors import ConfigurationError

        raise ConfigurationError(
            "idempotency_key() has no op here: it was called outside a durable op's "
            "function, or in one that no DeterministicRunner journals (graph.invoke where "
            "runner.invoke was meant, or a unit test), where a key would change on every "
            "retry. Fix: call it inside the function you pass to durable(name, fn, ...) / "
            "durable_sync(...), in a graph run by DeterministicRunner."
        )
    return key


def make_idempotency_key(*parts: str) -> str:
    """``lgd-`` and 32 hex digits of a hash of ``parts``: short enough for any API."""
    import hashlib

    digest = hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()
    return f"lgd-{digest[:32]}"


def _with_idempotency_key(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """On an ordered journal: run ``fn`` with the key of the op that is being created."""
    scope = _SCOPE.get()
    counters = scope.counters if scope is not None else {}
    inner = _innermost_node()
    local = f"{inner}:{name}" if inner else name
    key = f"{scope.key if scope else 'run'}/{local}#{counters.get(local, 0)}"
    sched = _SCHEDULER.get()
    idem = make_idempotency_key(getattr(sched, "idempotency_scope", "") or "", key)

    if inspect.iscoroutinefunction(fn):

        async def run_async(*a: Any, **kw: Any) -> Any:
            token = _IDEMPOTENCY_KEY.set(idem)
            try:
                return await fn(*a, **kw)
            finally:
                _IDEMPOTENCY_KEY.reset(token)

        return run_async

    def run(*a: Any, **kw: Any) -> Any:
        token = _IDEMPOTENCY_KEY.set(idem)
        try:
            result = fn(*a, **kw)
        finally:
            _IDEMPOTENCY_KEY.reset(token)
        if inspect.iscoroutine(result):
            return _awaited_with_key(result, idem)
        return result

    return run


async def _awaited_with_key(coro: Awaitable[Any], idem: str) -> Any:
    token = _IDEMPOTENCY_KEY.set(idem)
    try:
        return await coro
    finally:
        _IDEMPOTENCY_KEY.reset(token)


__all__ = [
    "KeyedSession",
    "RunSpec",
    "SleepSpec",
    "TaskScope",
    "current_scheduler",
    "durable",
    "durable_sync",
    "idempotency_key",
    "op_key",
]
