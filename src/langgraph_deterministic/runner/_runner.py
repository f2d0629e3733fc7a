"""``DeterministicRunner``: runs a compiled LangGraph graph with an ordered journal.

How it plugs into LangGraph (no monkeypatching): LangGraph's ``PregelRunner`` takes its
task-submit function from ``config["configurable"]["__pregel_runner_submit"]`` (a
zero-argument callable returning the submit function). The runner installs one there. Its
submit starts each task as an asyncio task whose context carries the task's replay-stable
key, and gives the task a *child* submit scope (written into the task's own configurable,
which subgraphs inherit), so:

* subgraph tasks get keys nested under their parent task's key;
* when a task finishes, every task it started and that is still running is cancelled and
  awaited (LangGraph's own executor does that when a loop exits: a failing sibling stops
  the others), and at the end of the run everything left is cancelled and awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from functools import cache
from typing import Any, Protocol, cast

from langgraph_deterministic._compat import installed
from langgraph_deterministic._compat.langgraph import (
    CONFIG_KEY_RUNNER_SUBMIT,
    PULL,
    PUSH,
    SUPPORTED_LANGGRAPH,
    check_runner_hooks,
    incompatible,
    skips_reraise,
)
from langgraph_deterministic.errors import ConcurrentRunError

from ._checkpointer import journaled_graph
from ._context import _KEYED, _SCHEDULER, _SCOPE, KeyedSession, TaskScope
from ._ordering import JournalBackend, OpScheduler

_SUBMIT_KEY = CONFIG_KEY_RUNNER_SUBMIT


class Journal(Protocol):
    """A durable journal the runner can order ops on (e.g. :class:`RestateJournal`).

    A *keyed* journal (:class:`PostgresJournal`) instead has ``keyed = True`` and
    ``open_session(attempt)``: it addresses ops by key, so they need no ordering, and the
    runner only hands it each op (see :class:`KeyedJournal`).
    """

    def open_backend(self) -> JournalBackend[Any]:
        """A fresh backend for one run."""
        ...

    def bind(self, scheduler: OpScheduler[Any]) -> AbstractContextManager[None]:
        """Route the journal's own API (e.g. ``restate_context()``) to ``scheduler``."""
        ...


class KeyedJournal(Protocol):
    """A journal that addresses ops by key (``PostgresJournal``): no ordering, no driver."""

    keyed: bool

    def open_session(self, attempt: str | None = None) -> KeyedSession:
        """A session for one runner call; ``attempt`` names the call's attempt."""
        ...


def _is_keyed(journal: Any) -> bool:
    return bool(getattr(journal, "keyed", False)) and callable(
        getattr(journal, "open_session", None)
    )


def _parse_version(v: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def _in_range(version: tuple[int, ...], spec: str) -> bool:
    """Whether ``version`` meets every ``>=x.y`` / ``<x.y`` clause of ``spec``."""
    for clause in spec.split(","):
        if clause.startswith(">="):
            if version < _parse_version(clause[2:]):
                return False
        elif clause.startswith("<") and version >= _parse_version(clause[1:]):
            return False
    return True


@cache
def check_langgraph() -> None:
    """Fail loudly unless the installed LangGraph offers the submit hook we rely on.

    Checked once per process (cached): a runner is cheap to build, per handler call."""
    if not _in_range(_parse_version(installed("langgraph")), SUPPORTED_LANGGRAPH):
        raise incompatible("is outside the supported versions")
    check_runner_hooks()


def _path_repr(path: tuple[Any, ...]) -> str:
    if not path:
        return ""
    if path[0] == PULL:
        return ""
    rest = path[1:] if path[0] == PUSH else path
    return "[" + ",".join(str(p) for p in rest) + "]"


def task_key(parent: str, task: Any) -> str:
    """Key of a Pregel task under its parent: ``<parent>/<name>@<step>[<push path>]``."""
    md = (getattr(task, "config", None) or {}).get("metadata") or {}
    step = md.get("langgraph_step", "?")
    return f"{parent}/{task.name}@{step}{_path_repr(tuple(task.path))}"


class _SubmitScope:
    """The tasks one Pregel task (or the run itself) started through our submit hook."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.tasks: set[asyncio.Task[Any]] = set()
        # Tasks submitted with __reraise_on_exit__ that failed, in submission order.
        self.failed: dict[asyncio.Task[Any], None] = {}

    def get_submit(self) -> Callable[..., asyncio.Future[Any]]:
        return self.submit

    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        __name__: str | None = None,
        __cancel_on_exit__: bool = False,
        __reraise_on_exit__: bool = True,
        __next_tick__: bool = False,
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        from langgraph.types import PregelExecutableTask

        ptask = args[0] if args and isinstance(args[0], PregelExecutableTask) else None
        if ptask is not None:
            key = task_key(self.key, ptask)
        else:  # pragma: no cover - LangGraph only submits tasks today
            key = f"{self.key}/{__name__ or getattr(fn, '__name__', 'fn')}"
        child = _SubmitScope(key)
        if ptask is not None:
            # The task's own configurable: subgraphs it runs inherit the child scope.
            ptask.config.setdefault("configurable", {})[_SUBMIT_KEY] = child.get_submit

        async def run() -> Any:
            _SCOPE.set(TaskScope(key))
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                return result
            finally:
                await child.cancel_all()

        coro: Coroutine[Any, Any, Any] = run()
        task = asyncio.get_running_loop().create_task(coro, name=__name__)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if __reraise_on_exit__:
            task.add_done_callback(self._note_failure)
        return task

    def _note_failure(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failed[task] = None

    def reraise(self) -> None:
        """What LangGraph's executor does when a run's loop exits without an error: raise
        the first error of a task submitted with ``__reraise_on_exit__`` (an interrupt is
        a signal, not an error; LangGraph marks the futures it re-raises elsewhere)."""
        from langgraph.errors import GraphBubbleUp

        for task in self.failed:
            exc = task.exception()
            if not isinstance(exc, GraphBubbleUp) and not skips_reraise(task):
                raise cast(BaseException, exc)

    async def cancel_all(self) -> None:
        while self.tasks:
            pending = [t for t in self.tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            self.tasks.difference_update(pending)
            self.tasks = {t for t in self.tasks if not t.done()}


class DeterministicRunner:
    """Run LangGraph graphs so that their durable ops replay deterministically.

    >>> runner = DeterministicRunner(journal=RestateJournal(ctx))
    >>> result = await runner.ainvoke(graph, {"topic": "x"})

    Inside nodes, call ``await durable("name", fn, *args)`` (or, with Restate,
    ``restate_context().run_typed(...)`` as usual). One runner may run several graphs one
    after another; each call gets its own driver.
    """

    def __init__(
        self, journal: Journal | KeyedJournal, *, replay_stall_timeout: float | None = 60.0
    ) -> None:
        """``replay_stall_timeout``: how long a replay may wait for the op the journal says
        comes next while other ops are waiting, before failing with NondeterminismError
        (None: wait forever; ordered journals only)."""
        check_langgraph()
        self._stall_timeout = replay_stall_timeout
        self._keyed = _is_keyed(journal)
        for attr in () if self._keyed else ("open_backend", "bind"):
            if not callable(getattr(journal, attr, None)):
                from langgraph_deterministic.errors import ConfigurationError

                raise ConfigurationError(
                    f"journal={journal!r} has no {attr}(). Fix: pass a journal such as "
                    "langgraph_deterministic.runner.RestateJournal(ctx) or "
                    "PostgresJournal(saver)."
                )
        self._journal: Any = journal
        self.last_stats: Any = None

    @contextmanager
    def _keyed_session(self, config: Any) -> Iterator[dict[str, Any]]:
        """A run on a keyed journal: LangGraph runs the graph as usual; ``durable()`` finds
        the session in a context variable (LangGraph copies the context into the threads
        and tasks it runs nodes in)."""
        self._refuse_nesting()
        from langgraph_deterministic.checkpointer.contract import ATTEMPT_KEY

        attempt = secrets.token_hex(16)  # not uuid4: code under test patches it
        session = self._journal.open_session(attempt)
        self.last_stats = getattr(session, "stats", None)
        cfg: dict[str, Any] = dict(config or {})
        # The saver hands this attempt token to the graph run (instead of minting one), so
        # the journal's fencing and the checkpoints' fencing name the same attempt.
        cfg["configurable"] = {**(cfg.get("configurable") or {}), ATTEMPT_KEY: attempt}
        from langgraph_deterministic.checkpointer.saver import CHECKPOINT_EVENTS, JOURNAL_ADMISSION

        token = _KEYED.set(session)
        # The session learns which checkpoints its attempt writes (claim-ahead, _postgres),
        # and the run's admission registers its attempt in the journal.
        listening = CHECKPOINT_EVENTS.set(getattr(session, "checkpoint_event", None))
        admitted = getattr(session, "admitted", None)
        admitting = JOURNAL_ADMISSION.set(None if admitted is None else (attempt, admitted))
        try:
            yield cfg
        finally:
            JOURNAL_ADMISSION.reset(admitting)
            CHECKPOINT_EVENTS.reset(listening)
            _KEYED.reset(token)

    @staticmethod
    def _refuse_nesting() -> None:
        if _SCHEDULER.get() is not None or _KEYED.get() is not None:
            from langgraph_deterministic.errors import ConfigurationError

            raise ConfigurationError(
                "DeterministicRunner runs cannot nest: a node is already running under one. "
                "Fix: call the inner graph directly (subgraphs are ordered by the outer run)."
            )

    @asynccontextmanager
    async def _session(self, config: Any) -> AsyncIterator[dict[str, Any]]:
        if self._keyed:
            with self._keyed_session(config) as keyed_cfg:
                yield keyed_cfg
            return
        self._refuse_nesting()
        backend = self._journal.open_backend()
        scheduler: OpScheduler[Any] = OpScheduler(backend, stall_timeout=self._stall_timeout)
        self.last_stats = scheduler.stats
        scope = getattr(self._journal, "idempotency_scope", None)
        if callable(scope):
            scheduler.idempotency_scope = str(scope())
        root = _SubmitScope("run")
        cfg: dict[str, Any] = dict(config or {})
        cfg["configurable"] = {**(cfg.get("configurable") or {}), _SUBMIT_KEY: root.get_submit}
        tok_s = _SCHEDULER.set(scheduler)
        tok_scope = _SCOPE.set(TaskScope("run"))
        bind = self._journal.bind(scheduler) or nullcontext()
        failed: BaseException | None = None
        # The journal's binding spans the whole session, cleanup included, so it sees (and
        # may translate, e.g. into Restate's TerminalError) every error the run ends with.
        with bind:
            scheduler.start()
            try:
                yield cfg
                root.reraise()
            except BaseException as exc:
                failed = exc
                raise
            finally:
                try:
                    await root.cancel_all()
                finally:
                    _SCHEDULER.reset(tok_s)
                    _SCOPE.reset(tok_scope)
                    fatal = scheduler.fatal
                    try:
                        await scheduler.aclose()
                    except BaseException as close_exc:
                        if close_exc is not failed:
                            raise close_exc from failed
                    finally:
                        close = getattr(backend, "close", None)
                        if callable(close):
                            close()  # after the driver stopped: it may hold a pending read
                    if fatal is None and failed is None and scheduler.unfulfilled():
                        from ._ordering import NondeterminismError

                        raise NondeterminismError(
                            "the run finished but the journal recorded durable ops it never asked "
                            f"for: {scheduler.unfulfilled()}. Node code took a different path on "
                            "replay. Fix: make control flow depend only on state and durable "
                            "results (see docs/explanation/deterministic-replay-on-restate.md)."
                        )

    def _pinned(self, graph: Any) -> tuple[Any, Any]:
        """On an ordered journal (Restate), the graph with its DeterministicSaver pinned to
        the run's start and its writes committed once (``_checkpointer``). A keyed journal
        (PostgresJournal) needs no pinning: its ops are keyed by the tasks of the checkpoints
        the saver writes as usual, and a retry must find those checkpoints."""
        if self._keyed:
            return graph, None
        return journaled_graph(graph)

    async def ainvoke(self, graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``graph.ainvoke(input, config, **kwargs)`` with ordered durable ops.

        A graph compiled with a ``DeterministicSaver`` starts every execution of the run
        from the checkpoint the first one started from, and stores the run's checkpoints
        once, when it returns (see ``_checkpointer``)."""
        async with self._session(config) as cfg:
            run_graph, store = self._pinned(graph)
            if store is None:  # a keyed journal: as invoke()
                session = _KEYED.get()
                for resumes in range(TWIN_RESUMES + 1):
                    try:
                        return await graph.ainvoke(input, cfg, **kwargs)
                    except ConcurrentRunError as exc:
                        thread = _lost_to_twin(exc, cfg) if resumes < TWIN_RESUMES else None
                        holds = getattr(session, "aholds_run", None)
                        if thread is None or holds is None or not await holds(thread):
                            raise
                raise AssertionError("unreachable")  # pragma: no cover
            try:
                try:
                    out = await run_graph.ainvoke(input, cfg, **kwargs)
                except Exception:
                    if store.can_commit():
                        await store.commit(None, keep_output=False, ended="error")
                    raise
                return await store.commit(out)
            finally:
                store.close()

    async def astream(
        self, graph: Any, input: Any, config: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """``graph.astream(input, config, **kwargs)`` (any ``stream_mode``) with ordered ops.

        With a ``DeterministicSaver`` the run's checkpoints are stored once the stream is
        exhausted (or the graph raised); a stream abandoned early stores nothing."""
        async with self._session(config) as cfg:
            run_graph, store = self._pinned(graph)
            try:
                try:
                    async for chunk in run_graph.astream(input, cfg, **kwargs):
                        yield chunk
                except Exception:
                    if store is not None and store.can_commit():
                        await store.commit(None, keep_output=False, ended="error")
                    raise
                if store is not None:
                    await store.commit(None, keep_output=False)
            finally:
                if store is not None:
                    store.close()

    def _sync_session(self, config: Any) -> AbstractContextManager[dict[str, Any]]:
        if not self._keyed:
            from langgraph_deterministic.errors import ConfigurationError

            raise ConfigurationError(
                f"runner.invoke()/stream() need a keyed journal such as PostgresJournal; "
                f"{type(self._journal).__name__} orders ops inside an async handler. Fix: "
                "await runner.ainvoke(...) / async for ... in runner.astream(...)."
            )
        return self._keyed_session(config)

    def invoke(self, graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """``graph.invoke(input, config, **kwargs)`` with journaled durable ops (sync nodes
        call ``durable_sync``). Keyed journals (``PostgresJournal``) only.

        An attempt that loses a checkpoint race to another attempt of its own run (two
        deliveries at once) resumes from the winner's checkpoint, up to ``TWIN_RESUMES``
        times, if it still holds the run in the journal: the attempt admitted last
        fenced the other off from the run's ops, so it must be the one that finishes
        the run, whichever of them stored the checkpoint first."""
        with self._sync_session(config) as cfg:
            session = _KEYED.get()
            for resumes in range(TWIN_RESUMES + 1):
                try:
                    return graph.invoke(input, cfg, **kwargs)
                except ConcurrentRunError as exc:
                    thread = _lost_to_twin(exc, cfg) if resumes < TWIN_RESUMES else None
                    holds = getattr(session, "holds_run", None)
                    if thread is None or holds is None or not holds(thread):
                        raise
            raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Iterator[Any]:
        """``graph.stream(input, config, **kwargs)`` (any ``stream_mode``) with journaled ops."""
        with self._sync_session(config) as cfg:
            yield from graph.stream(input, cfg, **kwargs)


#: How often a keyed-journal call resumes after losing a checkpoint race to an attempt of
#: its own run (each resume continues from the winner's newer checkpoint).
TWIN_RESUMES = 3


def _lost_to_twin(exc: BaseException, config: Any) -> str | None:
    """The thread, when ``exc`` is a checkpoint race lost to another attempt of the call's
    own run (the winner's checkpoints are stored: the call can resume from them)."""
    from langgraph_deterministic.checkpointer.contract import run_id_of

    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if not isinstance(exc, ConcurrentRunError) or not exc.checkpoint_race or thread is None:
        return None
    try:
        run_id, _ = run_id_of(config)
    except Exception:
        return None
    lost = run_id is not None and exc.lost_to_run == run_id
    return str(thread) if lost else None


__all__ = [
    "SUPPORTED_LANGGRAPH",
    "DeterministicRunner",
    "Journal",
    "KeyedJournal",
    "check_langgraph",
    "task_key",
]
