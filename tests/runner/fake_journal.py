"""An in-memory journal with Restate's replay rules, for property tests of the ordering core.

It is the collaborator of the unit under test (``OpScheduler``), not a stand-in for a
runnable component: the end-to-end tests run the same core on a real restate-server.

Rules it enforces, like Restate's shared core:

* commands are matched by position on replay; a different kind or name is a mismatch;
* while commands remain to replay, waiting on an op whose result is not journaled is an
  error ("'await' could not be replayed");
* an op's function runs only once it is awaited in processing mode; its result becomes
  durable when recorded, and a crash before that loses it (the op runs again on retry);
* a timer (a ``SleepSpec`` op, ``is_timer``) fires on the "server" a few ticks after it is
  created, whether or not anyone waits on it; on replay, a timer that fired is ready at
  once (its completion is in the journal).

A crash is modelled as "the attempt stops persisting after N durable events": the store
keeps what was persisted and the attempt is aborted with ``Crash``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langgraph_deterministic.runner._context import IN_OP, RunSpec, SleepSpec


class Crash(BaseException):
    """The attempt died (like kill -9): nothing after this point was persisted."""


class JournalMismatch(AssertionError):
    """Replay created a command different from the journaled one (Restate's 570)."""


class AwaitDuringReplay(AssertionError):
    """Waited on an op without a journaled result while replaying (also a 570)."""


@dataclass
class Store:
    """What the 'server' keeps across attempts."""

    commands: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    results: dict[int, tuple[bool, Any]] = field(default_factory=dict)  # idx -> (ok, value)
    executions: dict[str, int] = field(default_factory=dict)  # op name -> times fn ran
    recorded: dict[str, int] = field(default_factory=dict)  # op name -> results recorded


class FakeAttempt:
    """One execution attempt against a :class:`Store` (a ``JournalBackend``)."""

    def __init__(
        self,
        store: Store,
        *,
        io_ticks: Callable[[str], int],
        crash_after: int | None = None,
    ) -> None:
        self.store = store
        self.io_ticks = io_ticks
        self.crash_after = crash_after
        self.events = 0
        self.cursor = 0
        self.replay_len = len(store.commands)
        self.specs: dict[int, tuple[str, Any]] = {}
        self.running: dict[int, asyncio.Task[None]] = {}
        self.done: dict[int, tuple[bool, Any]] = {}
        self.changed = asyncio.Event()
        self.polls = 0
        self.polls_while_replaying = 0
        self.crashed = False
        self.timers: set[int] = set()

    # durable events -------------------------------------------------------------------

    def _persist(self) -> None:
        if self.crashed:
            raise Crash()
        self.events += 1
        if self.crash_after is not None and self.events > self.crash_after:
            self.crashed = True
            raise Crash()

    def is_replaying(self) -> bool:
        return self.cursor < self.replay_len

    def _command(self, kind: str, name: str) -> int:
        if self.is_replaying():
            expected = self.store.commands[self.cursor]
            if expected != (kind, name):
                raise JournalMismatch(
                    f"journal has {expected} at {self.cursor}, code made {(kind, name)}"
                )
            idx = self.cursor
            self.cursor += 1
            if idx in self.store.results:
                self.done[idx] = self.store.results[idx]
            return idx
        self._persist()
        self.store.commands.append((kind, name))
        idx = len(self.store.commands) - 1
        self.cursor = idx + 1
        self.replay_len = max(self.replay_len, self.cursor)
        return idx

    def start_op(self, key: str, spec: Any) -> int:
        if isinstance(spec, SleepSpec):
            idx = self._command("timer", key)
            self.timers.add(idx)
            if idx not in self.done:  # not fired yet: the server's clock runs it
                self.running[idx] = asyncio.get_running_loop().create_task(self._fire(idx))
            return idx
        idx = self._command("op", key)
        self.specs[idx] = (key, spec)
        return idx

    def is_timer(self, handle: int) -> bool:
        return handle in self.timers

    async def _fire(self, idx: int) -> None:
        for _ in range(self.io_ticks("timer")):
            await asyncio.sleep(0)
        if self._persisted():
            self.store.results[idx] = (True, None)
            self.done[idx] = (True, None)
            self.changed.set()

    def _persisted(self) -> bool:
        """Whether a completion may be recorded now: not after a crash, nor when this
        durable event is the one that crashes."""
        if self.crashed:
            return False
        try:
            self._persist()
        except Crash:
            self.changed.set()
            return False
        return True

    def start_decision(self, keys: list[str]) -> int:
        idx = self._command("decision", "lgd:order")
        snapshot = list(keys)
        self.specs[idx] = ("lgd:order", RunSpec("lgd:order", lambda: snapshot, (), {}))
        return idx

    def is_ready(self, handle: int) -> bool:
        return handle in self.done

    async def take(self, handle: int) -> Any:
        if self.crashed:
            raise Crash()
        ok, value = self.done.pop(handle)
        if ok:
            return value
        raise value

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, Crash | AssertionError)

    async def _execute(self, idx: int) -> None:
        name, spec = self.specs[idx]
        IN_OP.set(name)  # as the Restate backend does: ops may not nest
        self.store.executions[name] = self.store.executions.get(name, 0) + 1
        for _ in range(self.io_ticks(name)):
            await asyncio.sleep(0)
        try:
            value = spec.fn(*spec.args, **spec.kwargs)
            if asyncio.iscoroutine(value):
                value = await value
            outcome: tuple[bool, Any] = (True, value)
        except Exception as exc:
            outcome = (False, exc)
        if not self._persisted():
            return
        self.store.results[idx] = outcome
        self.store.recorded[name] = self.store.recorded.get(name, 0) + 1
        self.done[idx] = outcome
        self.changed.set()

    async def poll(self, handles: Sequence[int], wake: asyncio.Event) -> None:
        self.polls += 1
        if self.is_replaying():
            self.polls_while_replaying += 1
            raise AwaitDuringReplay(f"waited on {list(handles)} with commands left to replay")
        while True:
            if self.crashed:
                raise Crash()
            if any(h in self.done for h in handles) or wake.is_set():
                return
            for h in handles:
                if h not in self.running and h not in self.done:
                    self.running[h] = asyncio.get_running_loop().create_task(self._execute(h))
            self.changed.clear()
            waiters = [
                asyncio.ensure_future(self.changed.wait()),
                asyncio.ensure_future(wake.wait()),
            ]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def close(self) -> None:
        for t in self.running.values():
            t.cancel()


class FakeJournal:
    """The ``Journal`` a ``DeterministicRunner`` takes, over a :class:`FakeAttempt`."""

    def __init__(self, attempt: FakeAttempt) -> None:
        self.attempt = attempt

    def open_backend(self) -> FakeAttempt:
        return self.attempt

    @contextmanager
    def bind(self, scheduler: Any) -> Iterator[None]:
        yield
