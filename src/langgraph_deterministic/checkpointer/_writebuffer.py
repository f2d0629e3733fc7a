"""A superstep's pending writes, stored in the transaction of the checkpoint that ends it.

LangGraph saves every finished task's writes with ``put_writes`` and, once the superstep
is over, its checkpoint with ``put``; under ``durability="sync"`` it waits for that
``put`` before the next superstep starts. Committed one call at a time, a run pays one
commit (a WAL flush) and one round trip per task on top of one per superstep. Here the
writes of a graph run this saver admitted wait in memory for the ``put`` whose parent is
their checkpoint, and go out in its pipeline, in one transaction: a finished task's
writes are durable before the next superstep starts, as before, with one commit per
superstep. What does not wait:

* special writes (an error, an interrupt, a resume, a scheduled task) and input and
  Command writes: stored at once, with the writes of the same checkpoint waiting so far;
* writes whose checkpoint already has its child (a late write racing the ``put``);
* writes outside a graph run this saver admitted (``update_state``, direct calls, runs
  without ``run_config``), where no end of run is heard. A run's subgraphs share its
  ``run_config`` recorder: their writes wait for their own namespace's put.

Whatever is still waiting when the graph call ends, returns or raises, is stored in the
transaction that releases the run's lease; a read of the thread in this process stores
it first. The trade-off: a worker killed in the middle of a superstep loses the writes
of the tasks of that superstep that had finished (they run again on the retry), where
per-call commits would have kept those that got through. Nothing a finished superstep
wrote is at risk. ``DeterministicSaver(..., buffer_writes=False)`` commits every call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from langgraph_deterministic.checkpointer._core import Statement

# (checkpoint_ns, checkpoint_id) of the checkpoint pending writes belong to
Key = tuple[str, str]


@dataclass(slots=True)
class _Run:
    thread_id: str
    pending: dict[Key, list[Statement]] = field(default_factory=dict)
    # checkpoints whose child has been written: a write for them no longer waits
    sealed: set[Key] = field(default_factory=set)


class WriteBuffer:
    """Pending writes per graph run attempt, waiting for their checkpoint's child.

    Keyed by the attempt token, not the thread: a zombie attempt in the same process
    (its lease taken over) must not have its writes folded into the winner's put, where
    its fence would refuse the winner's whole transaction. Thread-safe: LangGraph's sync
    loop calls ``put_writes`` and ``put`` from executor threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}

    def add(self, attempt: str, thread_id: str, key: Key, statements: Sequence[Statement]) -> bool:
        """Keep ``statements`` for the put that continues ``key``. False when that put
        has been made already: the caller stores them itself."""
        with self._lock:
            run = self._runs.get(attempt)
            if run is None:
                run = self._runs[attempt] = _Run(thread_id)
            if key in run.sealed:
                return False
            run.pending.setdefault(key, []).extend(statements)
            return True

    def take(self, attempt: str, key: Key, *, seal: bool) -> list[Statement]:
        """The writes waiting for ``key`` (for the put continuing it: ``seal``, so a
        later write of that checkpoint is stored on its own)."""
        if attempt not in self._runs:  # unlocked fast path: nothing buffered for it
            return []
        with self._lock:
            run = self._runs.get(attempt)
            if run is None:
                return []
            if seal:
                run.sealed.add(key)
            return run.pending.pop(key, [])

    def end(self, attempt: str) -> list[Statement]:
        """The run is over: every write still waiting; the attempt is forgotten."""
        if attempt not in self._runs:
            return []
        with self._lock:
            run = self._runs.pop(attempt, None)
        return [st for sts in (run.pending.values() if run else ()) for st in sts]

    def take_thread(self, thread_id: str, checkpoint_ns: str | None = None) -> list[Statement]:
        """Every write waiting on the thread (in ``checkpoint_ns`` only, if given)."""
        if not self._runs:
            return []
        taken: list[Statement] = []
        with self._lock:
            for run in self._runs.values():
                if run.thread_id != thread_id:
                    continue
                for key in [k for k in run.pending if checkpoint_ns in (None, k[0])]:
                    taken.extend(run.pending.pop(key))
        return taken
