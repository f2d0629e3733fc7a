"""The saver's side of thread leases: release when a graph call returns, heartbeat while
it runs.

The core takes a lease when a graph run loads its thread (``lgd_admit_v3``) and every
checkpoint write renews it. Two things happen outside any saver call, so they live here:

* **release**: the call's ``RunInputRecorder`` (from ``run_config``) hears the root chain
  end or fail before ``invoke``/``ainvoke`` returns; it then releases the lease, so the
  next run on the thread is admitted at once (and a queue waiter is woken by NOTIFY).
  Under DeterministicRunner with a journal the run's commit releases it instead
  (``DeterministicSaver.astart_journaled_run`` / ``aput_batch(..., release=...)``).
* **heartbeat**: a node may run longer than the lease TTL without writing (a slow tool or
  model call). One daemon thread per saver renews the leases of every graph run in flight
  in this process, one statement every ``ttl / 3``, and only while there are any.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

from langchain_core.runnables import RunnableConfig

from langgraph_deterministic._db.batch import Operation, Statement, writes_first
from langgraph_deterministic.checkpointer import _admission, _core
from langgraph_deterministic.checkpointer.contract import HeldLease, find_recorder

logger = logging.getLogger("langgraph_deterministic")

#: How often a failed release is tried again (by the heartbeat thread, at most a second
#: apart) before the lease is left to expire.
RELEASE_TRIES = 30


class LeaseKeeper:
    """Releases and renews the leases one saver's graph runs hold."""

    def __init__(
        self,
        run: Callable[[Operation[None]], None],
        arun: Callable[[Operation[None]], Awaitable[None]],
        ttl: Callable[[], float],
        pending: Callable[[str], list[Statement]] = lambda attempt: [],
    ) -> None:
        self._run, self._arun, self._ttl = run, arun, ttl
        # the run's pending writes still waiting (see _writebuffer): stored with the release
        self._pending = pending
        self._held: dict[str, HeldLease] = {}
        # releases that failed (no connection, the server unreachable): retried by the
        # heartbeat thread, so a run that returned does not read unfinished once its
        # lease expires. (lease, ended, stored, tries)
        self._failed: list[tuple[HeldLease, str, bool, int]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def bind(self, config: RunnableConfig, *, is_async: bool) -> None:
        """After a graph run was admitted (``get_tuple``): release its lease when its call
        ends, and keep it alive meanwhile."""
        recorder = find_recorder(config)
        if recorder is None or recorder.held is None:
            return
        held = recorder.held

        def ops(ended: str) -> tuple[Operation[None], Operation[None] | None, int]:
            stored = recorder.stored
            """The release with the run's pending writes in its transaction; when there
            are writes, the release alone (run on a fresh connection if the first fails)
            and how many writes it would leave behind."""
            self.forget(held)
            writes = self._pending(held.attempt)
            at = recorder.take_interrupt(held)
            first = _admission.release_lease(
                held, ended, lazy=not writes, interrupted_at=at, stored=stored or bool(writes)
            )
            if not writes:
                return first, None, 0
            alone = _admission.release_lease(held, ended, lazy=True, interrupted_at=at)
            return writes_first(first, writes), alone, len(writes)

        if is_async:

            async def attempt(
                first: Operation[None], alone: Operation[None] | None, count: int
            ) -> None:
                try:
                    await self._arun(first)
                except Exception:
                    if alone is None:
                        raise
                    _lost(held, count)
                    await self._arun(alone)

            async def arelease(ended: str) -> None:
                stored = recorder.stored
                # Shielded: a call cancelled again while it releases (an orchestrator's
                # cancel) still ends its lease.
                try:
                    await asyncio.shield(asyncio.ensure_future(attempt(*ops(ended))))
                except Exception:
                    self._later(held, ended, stored)
                    raise

            recorder.bind_release(arelease, is_async=True)
        else:

            def release(ended: str) -> None:
                stored = recorder.stored
                first, alone, count = ops(ended)
                try:
                    try:
                        self._run(first)
                    except Exception:
                        if alone is None:
                            raise
                        _lost(held, count)
                        self._run(alone)
                except Exception:
                    self._later(held, ended, stored)
                    raise

            recorder.bind_release(release, is_async=False)
        self.keep(held)

    def _later(self, held: HeldLease, ended: str, stored: bool, tries: int = 0) -> None:
        if tries >= RELEASE_TRIES:
            logger.error(
                "langgraph-deterministic: the lease of run %r on thread %r could not be "
                "released after %d tries; it expires after lease_ttl.",
                held.run_id, held.thread_id, tries,
            )  # fmt: skip
            return
        with self._lock:
            self._failed.append((held, ended, stored, tries))
        self._start()

    def keep(self, held: HeldLease) -> None:
        """Renew ``held`` by the heartbeat until :meth:`forget` (or its release)."""
        with self._lock:
            self._held[held.attempt] = held
        self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._beat, name="langgraph-deterministic-lease", daemon=True
                )
                self._thread.start()

    def holds(self, attempt: str) -> bool:
        """Whether ``attempt`` is a graph run this saver admitted and will hear end."""
        return attempt in self._held

    def forget(self, held: HeldLease) -> None:
        with self._lock:
            self._held.pop(held.attempt, None)

    def close(self) -> None:
        with self._lock:
            self._held.clear()
            self._failed.clear()
        self._wake.set()

    def _beat(self) -> None:
        while True:
            self._wake.wait(
                max(0.05, min(1.0, self._ttl() / 3) if self._failed else self._ttl() / 3)
            )
            self._wake.clear()
            with self._lock:
                held = list(self._held.values())
                failed, self._failed = self._failed, []
                if not held and not failed:
                    self._thread = None
                    self._wake.clear()
                    return
            for lease, ended, stored, tries in failed:
                try:
                    self._run(_admission.release_lease(lease, ended, lazy=True, stored=stored))
                except Exception as exc:
                    logger.warning("langgraph-deterministic: lease release failed: %s", exc)
                    self._later(lease, ended, stored, tries + 1)
            if not held:
                continue
            try:
                self._run(_core.renew_leases(held))
            except Exception as exc:  # the next write or beat tries again; expiry is the fallback
                logger.warning("langgraph-deterministic: lease heartbeat failed: %s", exc)


def _lost(held: HeldLease, count: int) -> None:
    logger.warning(
        "langgraph-deterministic: %d pending write(s) of run %r on thread %r could not be "
        "stored when the run ended (see the error above); its tasks of the last superstep "
        "run again on a retry. The lease is released.",
        count,
        held.run_id,
        held.thread_id,
        exc_info=True,
    )
