"""``RestateJournal``: the ordering core on the Restate context of the current handler.

``restate-sdk`` is an optional extra: it is imported only when a ``RestateJournal`` is
built. What this module relies on in restate-sdk (every name in ``_compat/restate.py``,
checked once, when the first journal is built):

* ``ctx.run_typed`` / ``ctx.sleep`` to create commands, the returned futures' ``handle``
  and ``is_completed()``;
* to wait on several in-flight ops from ONE place and also wake up when a node asks for a
  new op, the driver runs the same progress loop ``restate.wait_completed`` runs
  (``ctx.vm.do_progress`` / ``ctx.receive`` / ``ctx.run_coros_to_execute``), with one
  difference: it can stop waiting without losing input (a pending read is kept for the
  next wait instead of being cancelled);
* routing unchanged code that calls ``restate.ext.langchain.restate_context()`` (e.g.
  ``RestateMiddleware``): while a run is active, restate's current-context variable holds
  a per-run context object whose ``run``/``run_typed``/``sleep`` go through the ordering
  core. Nothing is patched at class level; the variable is reset when the run ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, cast

from langgraph_deterministic._compat import supported
from langgraph_deterministic._compat.langgraph import NS_SEP, var_child_runnable_config
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    IncompatibleRestateError,
    JournalClosedError,
    SchemaNotReadyError,
)

from ._context import IN_OP, RunSpec, SleepSpec, current_scheduler, request
from ._ordering import NondeterminismError, OpScheduler

SUPPORTED_RESTATE = supported("restate-sdk", ">=1.3,<1.4")
DECISION_NAME = "lgd:order"


def _check_restate(ctx: Any) -> None:
    """Import restate-sdk through our compat module (its names are checked then, once)
    and refuse what is not the context of a Restate handler."""
    from langgraph_deterministic._compat.restate import ServerInvocationContext, check_context

    if not isinstance(ctx, ServerInvocationContext):
        raise ConfigurationError(
            f"RestateJournal(ctx) needs the Context a Restate handler receives, got {ctx!r}. "
            "Fix: build it inside the handler: RestateJournal(ctx)."
        )
    check_context(ctx)


def _is_misuse(exc: BaseException) -> bool:
    """Our errors that a retry cannot fix (not: Postgres briefly unreachable or not set up
    yet, nor a run ended because its journal closed)."""
    return isinstance(exc, DeterministicError) and not isinstance(
        exc, DatabaseUnavailableError | SchemaNotReadyError | JournalClosedError
    )


def _terminal(exc: DeterministicError) -> BaseException:
    from langgraph_deterministic._compat.restate import TerminalError

    return TerminalError(f"{type(exc).__name__}: {exc}", 500)


def _terminal_on_misuse(fn: Any) -> Any:
    """Make our own misuse errors raised inside an op terminal for Restate (no retries)."""
    import functools
    import inspect

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except DeterministicError as exc:
                if _is_misuse(exc):
                    raise _terminal(exc) from exc
                raise

        return guarded_async

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DeterministicError as exc:
            if _is_misuse(exc):
                raise _terminal(exc) from exc
            raise

    return guarded


class _RestateBackend:
    """:class:`JournalBackend` over one ``ServerInvocationContext``."""

    def __init__(self, ctx: Any) -> None:
        from langgraph_deterministic._compat.restate import ServerInvocationContext

        self._ctx = ctx
        self._real_run_typed = ServerInvocationContext.run_typed
        self._real_sleep = ServerInvocationContext.sleep
        self._futs: dict[int, Any] = {}
        self._names: dict[int, str] = {}
        # Handles whose result is already in the journal (a replayed run with its
        # completion): during replay, asking the VM for them cannot fail.
        self._journaled: set[int] = set()
        self._contexts: dict[int, contextvars.Context] = {}
        self._recv: asyncio.Future[Any] | None = None
        # Durable timers: the driver takes them only once a decision witnessed them.
        self._timers: set[int] = set()

    # creation ---------------------------------------------------------------------------

    def is_replaying(self) -> bool:
        return bool(self._ctx.vm.is_replaying())

    def start_op(self, key: str, spec: Any) -> int:
        from langgraph_deterministic._compat.restate import RunOptions

        ctx = self._ctx
        fut: Any
        if isinstance(spec, SleepSpec):
            fut = self._real_sleep(ctx, timedelta(seconds=spec.seconds), key)
        else:  # a RunSpec: request() takes no other kind
            options = spec.options if spec.options is not None else RunOptions()
            fn = _terminal_on_misuse(spec.fn)
            fut = self._real_run_typed(ctx, key, fn, options, *spec.args, **spec.kwargs)
        handle = int(fut.handle)
        self._futs[handle] = fut
        self._names[handle] = key
        if isinstance(spec, SleepSpec):
            self._timers.add(handle)
        else:
            self._note_replayed(handle)
        origin = getattr(spec, "context", None)
        if isinstance(origin, contextvars.Context):
            self._contexts[handle] = origin
        return handle

    def start_decision(self, keys: list[str]) -> int:
        from langgraph_deterministic._compat.restate import RunOptions

        snapshot = list(keys)

        async def decide() -> list[str]:
            return snapshot

        fut: Any = self._real_run_typed(
            self._ctx, DECISION_NAME, decide, RunOptions(type_hint=list[str])
        )
        handle = int(fut.handle)
        self._futs[handle] = fut
        self._note_replayed(handle)
        return handle

    def _note_replayed(self, handle: int) -> None:
        # restate-sdk schedules a run's closure only when the journal lacks its result.
        if handle not in self._ctx.run_coros_to_execute:
            self._journaled.add(handle)

    # results ----------------------------------------------------------------------------

    def is_ready(self, handle: int) -> bool:
        return handle in self._journaled or bool(self._futs[handle].is_completed())

    async def take(self, handle: int) -> Any:
        fut = self._futs.pop(handle)
        self._contexts.pop(handle, None)
        self._names.pop(handle, None)
        self._journaled.discard(handle)
        self._timers.discard(handle)
        return await fut

    def is_timer(self, handle: int) -> bool:
        return handle in self._timers

    def is_fatal(self, exc: BaseException) -> bool:
        from langgraph_deterministic._compat.restate import (
            DisconnectedException,
            SdkInternalBaseException,
        )

        return isinstance(exc, SdkInternalBaseException | DisconnectedException)

    async def poll(self, handles: Sequence[int], wake: asyncio.Event) -> None:
        from langgraph_deterministic._compat.restate import (
            DisconnectedException,
            DoProgressAnyCompleted,
            DoProgressCancelSignalReceived,
            DoProgressExecuteRun,
            FirstCompletedUnresolvedFuture,
            SdkInternalException,
            SingleUnresolvedFuture,
            Suspended,
            SuspendedException,
            TerminalError,
        )

        ctx = self._ctx
        unresolved = FirstCompletedUnresolvedFuture([SingleUnresolvedFuture(h) for h in handles])
        while True:
            await ctx.take_and_send_output()
            progress = ctx.vm.do_progress(unresolved)
            if isinstance(progress, BaseException):
                raise SdkInternalException() from progress
            if isinstance(progress, Suspended):
                raise SuspendedException()
            if isinstance(progress, DoProgressAnyCompleted):
                return
            if isinstance(progress, DoProgressCancelSignalReceived):
                raise TerminalError("cancelled", 409)
            if isinstance(progress, DoProgressExecuteRun):
                action = ctx.run_coros_to_execute.pop(progress.handle)
                origin = self._contexts.get(progress.handle)

                name = self._names.get(progress.handle, "?")

                async def execute(action: Any = action, name: str = name) -> None:
                    IN_OP.set(name)
                    try:
                        await action()
                    finally:
                        await ctx.receive.enqueue_restate_event(
                            {"type": "restate.run_completed", "data": None}
                        )

                # Run the op in the context of the node that asked for it (callbacks,
                # config, tracing), not the driver's.
                task = asyncio.get_running_loop().create_task(
                    execute(), context=origin.copy() if origin is not None else None
                )
                ctx.tasks.add(task)
                continue
            # Waiting for input (a completion from the server, or a run we started).
            if wake.is_set():
                return
            if self._recv is None:
                self._recv = asyncio.ensure_future(ctx.receive())
            waker = asyncio.ensure_future(wake.wait())
            try:
                await asyncio.wait({self._recv, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()
            recv = self._recv
            if recv is None or not recv.done():
                return  # a node asked for a new op; the read stays pending for next time
            chunk = recv.result()
            self._recv = None
            kind = chunk.get("type")
            if kind == "restate.run_completed":
                continue
            if kind == "http.disconnect":
                raise DisconnectedException()
            body = chunk.get("body", None)
            if body is not None and len(body) > 0:
                ctx.vm.notify_input(body)
            if not chunk.get("more_body", False):
                ctx.vm.notify_input_closed()

    def close(self) -> None:
        """Hand a read we started but did not consume back to the SDK's input path."""
        recv, self._recv = self._recv, None
        if recv is None:
            return
        if recv.done():
            if not recv.cancelled() and recv.exception() is None:
                chunk = recv.result()
                body = chunk.get("body", None)
                if chunk.get("type") == "http.request":
                    if body:
                        self._ctx.vm.notify_input(body)
                    if not chunk.get("more_body", False):
                        self._ctx.vm.notify_input_closed()
        else:
            recv.cancel()  # asyncio.Queue.get is cancellation-safe


_handle_ids = itertools.count(-1, -1)


def _in_run() -> bool:
    return current_scheduler() is not None


def _graph_scope() -> str:
    """The checkpoint namespace of the graph invocation the current node belongs to."""
    cfg = var_child_runnable_config.get() or {}
    ns = str((cfg.get("configurable") or {}).get("checkpoint_ns") or "")
    return ns.rpartition(NS_SEP)[0]


class _ScopedData(MutableMapping[str, Any]):
    """Writes go to ``own``; reads fall back to ``parent``."""

    def __init__(self, own: dict[str, Any], parent: dict[str, Any]) -> None:
        self._own, self._parent = own, parent

    def __getitem__(self, key: str) -> Any:
        if key in self._own:
            return self._own[key]
        return self._parent[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._own[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self._own:
            del self._own[key]
        else:
            del self._parent[key]

    def __iter__(self) -> Iterator[str]:
        return iter({**self._parent, **self._own})

    def __len__(self) -> int:
        return len({**self._parent, **self._own})


def _routed_classes() -> tuple[type, type, type]:
    """Build (once) the routed-context classes; they subclass restate-sdk's types."""
    global _ROUTED
    if _ROUTED is not None:
        return _ROUTED
    from langgraph_deterministic._compat.restate import (
        DefaultSerde,
        RunOptions,
        ServerDurableFuture,
        ServerInvocationContext,
    )

    class _GatherShim:
        """What ``restate.gather`` needs from ``future.context`` for routed futures."""

        def __init__(self) -> None:
            self.futures: dict[int, asyncio.Future[Any]] = {}
            self.vm = self

        def is_completed(self, handle: int) -> bool:
            fut = self.futures.get(handle)
            return fut is not None and fut.done()

        async def create_poll_or_cancel_coroutine(self, unresolved: Any) -> None:
            from langgraph_deterministic._compat.restate import (
                AllCompletedUnresolvedFuture,
                SingleUnresolvedFuture,
            )

            children: list[Any]
            if isinstance(unresolved, SingleUnresolvedFuture):
                children = [unresolved]
            elif isinstance(unresolved, AllCompletedUnresolvedFuture):
                children = list(unresolved.children)
            else:
                raise NondeterminismError(
                    "restate.select / wait_completed / as_completed over ops routed by "
                    "DeterministicRunner would pick a winner by local timing, which replay "
                    "cannot reproduce. Fix: use restate.gather or asyncio.gather inside nodes, "
                    "or race them in separate graph branches."
                )
            await asyncio.wait([self.futures[c.handle] for c in children])

    class RoutedDurableFuture(ServerDurableFuture[Any]):
        """A durable op routed through the ordering core; works with ``restate.gather``."""

        def __init__(self, shim: _GatherShim, fut: asyncio.Future[Any]) -> None:
            handle = next(_handle_ids)
            shim.futures[handle] = fut

            async def get() -> Any:
                return await fut

            super().__init__(cast(Any, shim), handle, get)
            self._lgd_fut = fut

        def is_completed(self) -> bool:
            # Always report "not yet": restate's combinators then ask the shim, which
            # answers deterministically (gather) or refuses (select), on replay as well.
            return False

    class RoutedContext(ServerInvocationContext):
        """The handler's context, with run/run_typed/sleep ordered by the runner."""

        _lgd_shim: _GatherShim
        _lgd_real: Any

        def __getattr__(self, name: str) -> Any:
            # Instance state (vm, random_instance, ...) is the real context's.
            return getattr(self.__dict__["_lgd_real"], name)

        @property
        def extension_data(self) -> Any:  # type: ignore[override]
            """Extension data, scoped per enclosing graph invocation.

            Restate's extensions keep per-invocation state here (RestateMiddleware: the
            turnstile of the current tool-call batch). Two agents running in parallel
            nodes would overwrite each other's; inside a subgraph (an agent run by a node)
            writes go to that subgraph invocation's own scope, reads fall back to the
            handler's data.
            """
            real = self.__dict__["_lgd_real"].extension_data
            scope = _graph_scope()
            if not scope:
                return real
            scopes: dict[str, dict[str, Any]] = self.__dict__["_lgd_scopes"]
            return _ScopedData(scopes.setdefault(scope, {}), real)

        def run_typed(  # type: ignore[override,unused-ignore]
            self, name: str, action: Any, options: Any = None, /, *args: Any, **kwargs: Any
        ) -> Any:
            spec = RunSpec(
                name, action, args, kwargs,
                options if options is not None else RunOptions(),
                contextvars.copy_context(),
            )
            fut = request(spec, name)
            if fut is None:  # called outside the run (e.g. a leaked reference)
                return ServerInvocationContext.run_typed(self, name, action, spec.options, *args, **kwargs)
            return RoutedDurableFuture(self._lgd_shim, fut)

        def run(  # type: ignore[override,unused-ignore]
            self,
            name: str,
            action: Any,
            serde: Any = None,
            max_attempts: int | None = None,
            max_retry_duration: timedelta | None = None,
            type_hint: Any = None,
            args: tuple[Any, ...] | None = None,
        ) -> Any:
            options = RunOptions(
                serde=serde if serde is not None else DefaultSerde(), type_hint=type_hint, max_attempts=max_attempts,
                max_duration=max_retry_duration,
            )
            return self.run_typed(name, action, options, *(args or ()))

        def sleep(self, delta: timedelta, name: str | None = None) -> Any:
            """A durable timer, ordered like the run's other durable ops."""
            fut = request(SleepSpec(delta.total_seconds()), name or "sleep")
            if fut is None:  # called outside the run
                return ServerInvocationContext.sleep(self.__dict__["_lgd_real"], delta, name)
            return RoutedDurableFuture(self._lgd_shim, fut)

    _ROUTED = (_GatherShim, RoutedDurableFuture, RoutedContext)
    return _ROUTED


_ROUTED: tuple[type, type, type] | None = None


class RestateJournal:
    """Journal durable ops on the Restate context of the current handler.

    ``route_restate_context=True`` (default) also orders ops that unchanged code creates
    through ``restate.ext.langchain.restate_context()`` (``run``, ``run_typed``, ``sleep``),
    e.g. ``RestateMiddleware``'s LLM calls and ``run_typed`` calls inside tools.
    """

    def __init__(self, ctx: Any, *, route_restate_context: bool = True) -> None:
        _check_restate(ctx)
        self._ctx = ctx
        self._route = route_restate_context

    def idempotency_scope(self) -> str:
        """The invocation id: op keys repeat across invocations, idempotency keys must not."""
        return str(self._ctx.request().id)

    def open_backend(self) -> _RestateBackend:
        """A fresh backend for one run, on this journal's Restate context."""
        return _RestateBackend(self._ctx)

    @contextmanager
    def bind(self, scheduler: OpScheduler[Any]) -> Iterator[None]:
        """For the length of a run: route ``restate_context()`` and the handler's own
        ``ctx`` (``run``/``run_typed``/``sleep``) through the run's ordering core, and make
        our misuse errors terminal for Restate (a retry would replay the same mistake)."""
        token = None
        shadowed: list[str] = []
        if self._route:
            from langgraph_deterministic._compat.restate import _restate_context_var

            shim_cls, _, ctx_cls = _routed_classes()
            routed: Any = object.__new__(ctx_cls)
            routed.__dict__["_lgd_real"] = self._ctx
            routed.__dict__["_lgd_shim"] = shim_cls()
            routed.__dict__["_lgd_scopes"] = {}
            token = _restate_context_var.set(routed)
            # The handler's ctx reaches nodes too (a closure, the config): shadow its
            # methods on this instance only, never on the class; removed when the run ends.
            real = self._ctx.__dict__
            for attr in _ROUTED_METHODS:
                if attr not in real:
                    real[attr] = getattr(routed, attr)
                    shadowed.append(attr)
        try:
            yield
        except DeterministicError as exc:
            fatal = scheduler.fatal
            if _is_misuse(exc) and (fatal is None or isinstance(fatal, DeterministicError)):
                raise _terminal(exc) from exc
            raise
        finally:
            for attr in shadowed:
                self._ctx.__dict__.pop(attr, None)
            if token is not None:
                from langgraph_deterministic._compat.restate import _restate_context_var

                _restate_context_var.reset(token)


_ROUTED_METHODS = ("run", "run_typed", "sleep")


__all__ = ["SUPPORTED_RESTATE", "IncompatibleRestateError", "RestateJournal"]
