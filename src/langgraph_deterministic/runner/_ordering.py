"""The ordering core: which durable op is journaled when, decided once and replayed.

This module knows nothing about LangGraph or Restate. It owns one driver loop per run that
is the only code touching the journal: node tasks call :meth:`OpScheduler.request`, which
enqueues the op and hands back an ``asyncio.Future`` the driver resolves.

The journal protocol the driver speaks
--------------------------------------
Durable journals (Restate's among them) match commands by position on replay, and refuse
to wait on a result that is not already in the journal while commands remain to replay.
Parallel LangGraph tasks reach their durable ops in I/O-completion order, which differs
between the first execution and every replay. So the driver makes its scheduling
decisions durable:

1. On the first execution, ops are created in *arrival* order. Before a batch of arrived
   ops is created, the driver journals a small *decision* (a journaled op whose value is
   the ordered list of the op keys about to be created) and waits for it to be durable.
2. On replay, the decision comes back from the journal; the driver waits until the node
   tasks have requested exactly those keys and creates them in the recorded order. Keys
   requested early wait for their own decision.
3. Results are handed to node tasks as soon as the journal has them. During replay the
   driver never waits on the journal (it only waits for node tasks to ask for the next
   recorded op); once replay is over it waits on *all* in-flight ops at once, from one
   place, and also wakes up when a node task asks for a new op.

No barrier between branches: a branch whose op completes asks for its next op at once,
and the next decision carries it. Each decision costs one journal round trip.

Timers (a backend's ``is_timer``, e.g. Restate's ``ctx.sleep``) need one more rule. A
run's result is either journaled or not when it is created, but whether a timer fired is
not known on replay, and waiting for one that has not is refused while commands remain.
So a timer that fires is handed to its node only after a decision *witnessed* it (the
decision lists ``~<key>``, with whatever ops had arrived). On replay, while timers are in
flight and nothing else is due, the next journaled command can only be such a decision:
the driver creates it at once and learns from its journaled value which timers fired.

Keys must identify an op stably across executions (see ``_context.op_key``); the driver
checks that no key is requested twice while pending and that every recorded key is
eventually requested, and raises :class:`NondeterminismError` otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from langgraph_deterministic.errors import JournalClosedError, NondeterminismError

H = TypeVar("H", bound=Hashable)
log = logging.getLogger("langgraph_deterministic.runner")
WITNESS = "~"  # "~<op key>" in a decision: that timer had fired (op keys never start so)


class JournalBackend(Protocol[H]):
    """What the driver needs from a journal (Restate's, or an in-memory one in tests).

    Handles are opaque and hashable. Every method except :meth:`poll` and :meth:`take` is
    synchronous: creating a command must not yield to other tasks.
    """

    def is_replaying(self) -> bool:
        """True while commands recorded by an earlier execution remain to be re-created."""
        ...

    def start_op(self, key: str, spec: Any) -> H:
        """Create the journal command for one op now; return its handle."""
        ...

    def start_decision(self, keys: list[str]) -> H:
        """Create a journaled record whose value is ``keys`` unless it is replayed."""
        ...

    def is_ready(self, handle: H) -> bool:
        """True when the result of ``handle`` is available without waiting."""
        ...

    async def take(self, handle: H) -> Any:
        """Return the result of a ready handle, or raise the op's failure."""
        ...

    async def poll(self, handles: Sequence[H], wake: asyncio.Event) -> None:
        """Wait until one of ``handles`` is ready or ``wake`` is set (never while replaying)."""
        ...

    def is_fatal(self, exc: BaseException) -> bool:
        """True if ``exc`` from :meth:`take` ends the attempt (suspension, protocol error)."""
        ...

    def close(self) -> None:
        """Release what the backend holds once the driver has stopped."""
        ...


@dataclass
class _Request:
    key: str
    spec: Any
    future: asyncio.Future[Any]


@dataclass
class SchedulerStats:
    """Counters a run exposes for tests and benchmarks."""

    ops_created: int = 0
    decisions_created: int = 0
    decisions_replayed: int = 0
    polls: int = 0
    created_keys: list[str] = field(default_factory=list)


class OpScheduler(Generic[H]):
    """One driver loop per run; see the module docstring for the protocol."""

    def __init__(self, backend: JournalBackend[H], *, stall_timeout: float | None = 60.0) -> None:
        self._backend = backend
        self._stall_timeout = stall_timeout
        self._pending: dict[str, _Request] = {}
        self._inflight: dict[H, _Request] = {}
        self._plan: deque[str] = deque()
        self._decision: H | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._closed = False
        self._fatal: BaseException | None = None
        self._driver: asyncio.Task[None] | None = None
        self.stats = SchedulerStats()
        is_timer = getattr(backend, "is_timer", None)
        self._is_timer: Any = is_timer if callable(is_timer) else (lambda _h: False)
        self._fired: list[H] = []  # timers that fired, not yet in a decision
        # Fired timers the in-flight decision lists: not "fired, not yet in a decision"
        # any more (else the next pass would list them again and, once the decision is
        # read and they are taken, look up handles no longer in flight), nor taken yet.
        self._listed: list[H] = []
        self._witnessed: set[str] = set()  # timers a decision listed: may be taken
        #: what makes op keys unique beyond one run (e.g. Restate's invocation id), for
        #: idempotency_key()
        self.idempotency_scope = ""

    # -- node-task side -------------------------------------------------------------------

    def request(self, key: str, spec: Any) -> asyncio.Future[Any]:
        """Enqueue one durable op; the returned future resolves with its journaled result."""
        if self._fatal is not None:
            raise self._fatal
        if self._closing or self._closed:
            raise JournalClosedError(
                f"durable op {key!r} was requested after its DeterministicRunner run finished. "
                "Fix: only call durable ops from code the run awaits (nodes, tools, middleware), "
                "not from background tasks that outlive runner.ainvoke()/astream()."
            )
        if key in self._pending or any(r.key == key for r in self._inflight.values()):
            raise NondeterminismError(
                f"durable op key {key!r} is already in flight. Two concurrent durable ops in one "
                "task share a name and cannot be told apart on replay. Fix: give concurrent "
                "ops distinct names, e.g. durable(f'fetch:{url}', ...)."
            )
        # A request is never withdrawn, even if its task is cancelled: whether it made it
        # into a decision would then depend on timing. Its result is simply discarded.
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[key] = _Request(key, spec, fut)
        self._wake.set()
        return fut

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(
                self._drive(), name="langgraph-deterministic-driver"
            )

    async def aclose(self) -> None:
        """Stop the driver (ops still in flight belong to cancelled tasks); re-raise a fatal error."""
        self._closing = True
        self._wake.set()
        if self._driver is not None:
            try:
                await self._driver
            finally:
                self._closed = True
        self._closed = True
        if self._fatal is not None:
            raise self._fatal

    @property
    def fatal(self) -> BaseException | None:
        return self._fatal

    def unfulfilled(self) -> list[str]:
        """Keys a replayed decision promised but no task asked for (empty when healthy)."""
        return list(self._plan)

    # -- driver ---------------------------------------------------------------------------

    async def _drive(self) -> None:
        try:
            await self._drive_inner()
        except asyncio.CancelledError:
            self._fail_all(JournalClosedError("the DeterministicRunner driver was cancelled"))
            raise
        except BaseException as exc:  # suspension, protocol errors, bugs: end the attempt
            self._fatal = exc
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for req in [*self._pending.values(), *self._inflight.values()]:
            if not req.future.done():
                req.future.set_exception(exc)
        self._pending.clear()
        self._inflight.clear()

    def _create_planned(self) -> bool:
        created = False
        b = self._backend
        while self._plan and self._plan[0] in self._pending:
            req = self._pending[self._plan[0]]
            h = b.start_op(req.key, req.spec)  # if this raises, req stays pending (and failed)
            del self._pending[req.key]
            self._plan.popleft()
            log.debug("op created %s replaying=%s", req.key, b.is_replaying())
            self.stats.ops_created += 1
            self.stats.created_keys.append(req.key)
            self._inflight[h] = req
            created = True
        if self._plan or self._decision is not None or self._closing:
            return created
        waiting_timer = b.is_replaying() and any(
            self._is_timer(h) and r.key not in self._witnessed for h, r in self._inflight.items()
        )
        if self._pending or self._fired or waiting_timer:
            keys = list(self._pending)  # arrival order
            keys += [WITNESS + self._inflight[h].key for h in self._fired]
            self._listed, self._fired = self._fired, []
            self._decision = b.start_decision(keys)
            log.debug("decision created %s replaying=%s", keys, b.is_replaying())
            self.stats.decisions_created += 1
            created = True
        return created

    async def _harvest(self) -> bool:
        b = self._backend
        progressed = False
        if self._decision is not None and b.is_ready(self._decision):
            value = await b.take(self._decision)
            self._decision = None
            if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
                raise NondeterminismError(
                    f"a journaled scheduling decision holds {value!r}, not a list of op keys. "
                    "The journal was written by other code. Fix: replay it with the code (and "
                    "langgraph-deterministic version) that wrote it."
                )
            # (empty: created on replay to read a witness the attempt did not record)
            self._witnessed.update(k[len(WITNESS):] for k in value if k.startswith(WITNESS))
            # A listed timer the value does not witness (not one this attempt wrote) waits
            # for the next decision.
            self._fired += [h for h in self._listed if self._inflight[h].key not in self._witnessed]
            self._listed = []
            self._plan.extend(k for k in value if not k.startswith(WITNESS))
            log.debug("decision read %s", value)
            self.stats.decisions_replayed += 1
            progressed = True
        for h in list(self._inflight):
            if self._is_timer(h):
                if self._inflight[h].key not in self._witnessed:
                    if (
                        h not in self._fired
                        and h not in self._listed
                        and not b.is_replaying()
                        and b.is_ready(h)
                    ):
                        self._fired.append(h)  # the next decision witnesses it
                        progressed = True
                    continue
            elif not b.is_ready(h):
                continue
            req = self._inflight.pop(h)
            self._witnessed.discard(req.key)
            progressed = True
            try:
                value = await b.take(h)
            except BaseException as exc:
                if b.is_fatal(exc) or not isinstance(exc, Exception):
                    self._inflight[h] = req
                    raise
                if not req.future.done():
                    req.future.set_exception(exc)
            else:
                if not req.future.done():
                    req.future.set_result(value)
        return progressed

    async def _wait_for_requests(self) -> None:
        stalled = bool(self._plan) and bool(self._pending) and self._plan[0] not in self._pending
        if not stalled or self._stall_timeout is None:
            await self._wake.wait()
            return
        try:
            await asyncio.wait_for(self._wake.wait(), self._stall_timeout)
        except TimeoutError:
            raise NondeterminismError(
                f"replay is stuck: the journal says the next durable op is {self._plan[0]!r}, "
                f"but for {self._stall_timeout:g}s the run has only asked for "
                f"{sorted(self._pending)}. Node code took a different path than when the "
                "journal was written (control flow from time, randomness, globals or I/O "
                "outside durable ops, or changed code). Fix: derive control flow only from "
                "graph state and durable results; deploy changed code as a new revision."
            ) from None

    async def _drive_inner(self) -> None:
        b = self._backend
        while True:
            self._wake.clear()
            progressed = self._create_planned()
            progressed = await self._harvest() or progressed
            if progressed:
                continue
            if self._closing:
                return
            # (fired timers are ready: waiting on them would return at once)
            handles: list[H] = [
                h for h in self._inflight if h not in self._fired and h not in self._listed
            ]
            if self._decision is not None:
                handles.append(self._decision)
            if not handles or b.is_replaying():
                await self._wait_for_requests()
                continue
            self.stats.polls += 1
            log.debug("poll %d handles", len(handles))
            await b.poll(handles, self._wake)
            log.debug("poll returned")


__all__ = [
    "JournalBackend",
    "JournalClosedError",
    "NondeterminismError",
    "OpScheduler",
    "SchedulerStats",
]
