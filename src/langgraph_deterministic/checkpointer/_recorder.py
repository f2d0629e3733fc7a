"""The LangChain callback that records a graph call's input (and releases its lease)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableConfig

from langgraph_deterministic.checkpointer._fingerprint import input_fingerprint
from langgraph_deterministic.checkpointer._ledger import HeldLease
from langgraph_deterministic.errors import ConcurrentRunError

logger = logging.getLogger("langgraph_deterministic")


class RunInputRecorder(BaseCallbackHandler):
    """Records the input of the graph call made with a ``run_config`` config.

    LangGraph reports the input to the root callback (``on_chain_start``) right before it
    loads the thread's checkpoint, in the same thread or task; the saver reads the
    fingerprint from this handler in that ``get_tuple`` and can refuse a mismatched or
    duplicated input before a single node runs. It stores nothing and sends nothing.
    """

    run_inline = True
    raise_error = False

    def __init__(self) -> None:
        super().__init__()
        self.fingerprint: str | None = None
        #: the input, kept only when it could not be fingerprinted: the saver checks it
        #: can be stored before admitting the run (a refused input leaves no row)
        self.unfingerprinted: tuple[Any] | None = None
        #: the lease this call's graph run was admitted with (set by the saver's core)
        self.held: HeldLease | None = None
        #: that run's attempt (its lease and attempt token) once a committed root write of
        #: it has made its ledger row current: its later writes need not touch the row
        self.ledger_written: tuple[HeldLease, str | None] | None = None
        #: that run's attempt and the checkpoint of the last interrupt it stored
        self.interrupted_at: tuple[HeldLease, str] | None = None
        #: a write of this call was committed (its release then ends the lease; a call
        #: that raised before storing anything undoes its admission instead)
        self.stored = False
        self._release: Callable[[str], Any] | None = None
        # The chain run of the call this config was built for: the first one reported to
        # this handler. LangChain hands a call's handlers on to the calls made inside it
        # (a graph invoked in a node of another), whose chains it reports here too.
        self._root: uuid.UUID | None = None

    def take_interrupt(self, held: HeldLease) -> str | None:
        """The checkpoint of the last interrupt ``held``'s attempt stored, once; None if it
        stored none."""
        marked, self.interrupted_at = self.interrupted_at, None
        return marked[1] if marked is not None and marked[0] is held else None

    @property
    def bound(self) -> bool:
        """Whether a lease's release is bound to this call already (a call inside it that
        found this handler, having none of its own, must not take its place)."""
        return self._release is not None

    def bind_release(
        self, release: Callable[[str], Any] | Callable[[str], Awaitable[Any]], *, is_async: bool
    ) -> None:
        """Have ``release("ok" | "error")`` called when the graph call returns or raises.

        LangGraph reports the root chain's end to its callbacks before ``invoke`` /
        ``ainvoke`` returns, so the thread is free by the time the caller sees the
        result. For an async run the hooks are coroutines (LangChain awaits them on the
        event loop); for a sync run, plain calls.
        """
        self._release = release
        if is_async:
            self.on_chain_end = self._aend  # type: ignore[method-assign,assignment]
            self.on_chain_error = self._aerror  # type: ignore[method-assign,assignment]
        else:
            self.on_chain_end = self._end  # type: ignore[method-assign]
            self.on_chain_error = self._error  # type: ignore[method-assign]

    def _take_release(self, run_id: uuid.UUID | None) -> Callable[[str], Any] | None:
        if run_id is None or run_id != self._root:
            return None
        self._root = None  # the call is over: a retry with this config is a call anew
        release, self._release = self._release, None
        self.held = self.ledger_written = None
        return release

    def _failed(self, error: BaseException) -> str:
        """How a call that raised ends its lease: ``lost`` when it lost a race to another
        attempt of its own run (that one holds the thread on), else ``error``."""
        held = self.held
        if isinstance(error, ConcurrentRunError) and held is not None:
            return "lost" if error.lost_to_run == held.run_id else "error"
        return "error"

    # Without a lease (bind_release replaces these): only the end of the call is noted.
    def on_chain_end(self, outputs: Any, *, run_id: uuid.UUID | None = None, **kw: Any) -> None:
        self._take_release(run_id)

    def on_chain_error(
        self, error: BaseException, *, run_id: uuid.UUID | None = None, **kw: Any
    ) -> None:
        self._take_release(run_id)

    def _end(self, outputs: Any, *, run_id: uuid.UUID | None = None, **kw: Any) -> None:
        if (release := self._take_release(run_id)) is not None:
            release("ok")

    def _error(
        self, error: BaseException, *, run_id: uuid.UUID | None = None, **kw: Any
    ) -> None:
        ended = self._failed(error)
        if (release := self._take_release(run_id)) is not None:
            release(ended)

    async def _aend(self, outputs: Any, *, run_id: uuid.UUID | None = None, **kw: Any) -> None:
        if (release := self._take_release(run_id)) is not None:
            await release("ok")

    async def _aerror(
        self, error: BaseException, *, run_id: uuid.UUID | None = None, **kw: Any
    ) -> None:
        ended = self._failed(error)
        if (release := self._take_release(run_id)) is not None:
            await release(ended)

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: uuid.UUID,
        parent_run_id: uuid.UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if self._root is not None:
            return
        self._root = run_id
        self.unfingerprinted = None
        try:
            self.fingerprint = input_fingerprint(inputs)
        except (TypeError, ValueError) as exc:
            self.fingerprint = None
            self.unfingerprinted = (inputs,)
            logger.warning(
                "langgraph-deterministic cannot fingerprint this graph input (%s): a retry "
                "with a different input under the same run_id will not be detected.",
                exc,
            )

    def __deepcopy__(self, memo: dict[int, Any]) -> RunInputRecorder:
        return self  # configs get copied; the handler must stay the one LangGraph calls

    def __copy__(self) -> RunInputRecorder:
        return self


def find_recorder(config: RunnableConfig) -> RunInputRecorder | None:
    callbacks = config.get("callbacks")
    if not callbacks:
        return None
    if type(callbacks) is list:  # run_config's own list, on every saver call of its run
        for handler in reversed(callbacks):
            if isinstance(handler, RunInputRecorder):
                return handler
        return None
    if isinstance(callbacks, list | tuple):
        handlers: Iterable[Any] = callbacks
    else:
        handlers = [
            *getattr(callbacks, "handlers", ()),
            *getattr(callbacks, "inheritable_handlers", ()),
        ]
    recorders = [h for h in handlers if isinstance(h, RunInputRecorder)]
    if not recorders:
        return None
    # A graph called inside a node of another graph run sees the outer call's recorder
    # too: its own is the one whose chain this config's callbacks are the children of
    # (the one LangChain added last, failing that).
    parent = getattr(callbacks, "parent_run_id", None)
    if parent is not None:
        for recorder in recorders:
            if recorder._root == parent:
                return recorder
    return recorders[-1]
