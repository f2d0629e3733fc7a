"""A graph's DeterministicSaver under a durable journal: pinned start, one commit.

A journal replays a run by re-running the graph from where the *first* execution started,
handing back journaled results. A checkpointer that persists across executions breaks
that: the first execution moved the thread on in Postgres, so a replay would resume
LangGraph from a later checkpoint, skip the steps whose ops the journal holds, and stall.

So, for the length of one runner call, the graph's saver is wrapped:

* **Pinned start.** The run's first load of its thread runs the saver's own start checks
  (run id, input fingerprint, duplicate Command, late retry) inside a durable op
  (``lgd:checkpoint:start``) that journals which checkpoint the run starts from, the
  attempt token the saver handed out, and which pending writes that checkpoint had. Every
  execution rebuilds exactly that starting point, whatever Postgres holds by then.
* **Buffered writes.** Checkpoints and pending writes go to memory while the graph runs;
  subgraph loads see this run's own writes first, then what Postgres held before the pin.
* **One commit.** When the graph returns (or raises), a durable op (``lgd:checkpoint:commit``)
  stores the buffered writes in one transaction with the saver's usual guards and ledger
  (``DeterministicSaver.aput_batch``), at most once per run, and journals the graph's
  output.
* **The lease is the run's.** The thread's lease (multitask strategies) is taken by the
  start op and released by the commit, in its transaction (``ok``, or ``error`` when the
  graph raised). An attempt that is suspended or killed raises through the graph call
  without being the run's end, and a replay never admits again, so the graph call's
  callbacks do not release it; each execution keeps it alive while it runs. Every execution returns that journaled output, so what the caller sees (message
  ids, interrupt ids) is what the thread holds.

A Restate retry replays the same run (same run id, same pin); a new invocation is a new
run that pins the thread's head as it is then.
"""

from __future__ import annotations

import base64
import contextvars
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
)
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_deterministic._serde import guarded_loads
from langgraph_deterministic.checkpointer.contract import (
    ATTEMPT_KEY,
    HEAD_KEY,
    RUN_ID_KEY,
    HeldLease,
    head_mark,
)
from langgraph_deterministic.errors import NondeterminismError

from ._context import RunSpec, current_scheduler, request

START_OP = "lgd:checkpoint:start"
LOAD_OP = "lgd:checkpoint:load"
COMMIT_OP = "lgd:checkpoint:commit"


def journaled_graph(graph: Any) -> tuple[Any, JournaledCheckpointer | None]:
    """``graph`` with its DeterministicSaver wrapped for one run, or unchanged."""
    from langgraph_deterministic.checkpointer.saver import DeterministicSaver

    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, DeterministicSaver):
        return graph, None
    wrapped = JournaledCheckpointer(saver)
    return graph.copy(update={"checkpointer": wrapped}), wrapped


async def _journaled(name: str, fn: Any) -> Any:
    fut = request(RunSpec(name, fn, (), {}, None, contextvars.copy_context()), name)
    if fut is None:  # pragma: no cover - only built inside a runner session
        return await fn()
    return await fut


def _encode(serde: Any, value: Any) -> list[str]:
    type_, blob = serde.dumps_typed(value)
    return [type_, base64.b64encode(blob).decode("ascii")]


def _decode(serde: Any, encoded: Sequence[str]) -> Any:
    return guarded_loads(serde, encoded[0], base64.b64decode(encoded[1]))


class JournaledCheckpointer(BaseCheckpointSaver[str]):
    """One run's view of a DeterministicSaver under a journal (see the module docstring)."""

    def __init__(self, saver: Any) -> None:
        super().__init__(serde=saver.serde)
        self._saver = saver
        self._mem = InMemorySaver(serde=saver.serde)
        self._log: list[tuple[Any, ...]] = []
        self._started = False
        self._pin: CheckpointTuple | None = None
        #: the run's lease (journaled by the start op); released by the commit
        self._held: HeldLease | None = None

    # -- what a write snapshot is ---------------------------------------------------------

    def _snapshot(self, found: CheckpointTuple) -> list[Any]:
        """The pending writes of ``found``, as the journal keeps them: special writes
        (interrupts, resumes, errors: a later write of the same task replaces them) with
        their value, the others (never replaced) by task and channel."""
        return [
            [task, channel, _encode(self.serde, value) if channel in WRITES_IDX_MAP else None]
            for task, channel, value in found.pending_writes or ()
        ]

    def _restore(self, found: CheckpointTuple, snapshot: list[Any]) -> list[PendingWrite]:
        pool: dict[tuple[str, str], deque[Any]] = {}
        for task, channel, value in found.pending_writes or ():
            if channel not in WRITES_IDX_MAP:
                pool.setdefault((task, channel), deque()).append(value)
        out: list[PendingWrite] = []
        for task, channel, special in snapshot:
            if special is not None:
                out.append((task, channel, _decode(self.serde, special)))
                continue
            queue = pool.get((task, channel))
            if not queue:
                raise NondeterminismError(
                    f"checkpoint {found.config['configurable']['checkpoint_id']} lost a pending "
                    f"write of task {task} (channel {channel!r}) since this run first loaded it "
                    "(a prune or delete_thread meanwhile?), so the run cannot be replayed. Fix: "
                    "do not prune or delete threads with a run in flight."
                )
            out.append((task, channel, queue.popleft()))
        return out

    # -- reads ----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self._mem.aget_tuple(config)
        if found is not None:
            return found
        conf = config.get("configurable") or {}
        ns = str(conf.get("checkpoint_ns") or "")
        wanted = conf.get("checkpoint_id")
        if ns == "":
            if not self._started:
                await self._start(config)
            pin = self._pin
            if wanted is None or (pin is not None and wanted == self._pin_id()):
                return pin
        if self._pin is None:
            return None  # the thread was empty when the run started
        # Another namespace (a subgraph), or an addressed checkpoint: what Postgres held
        # before the run started (this run's own writes are in memory).
        base: dict[str, Any] = {"thread_id": conf["thread_id"], "checkpoint_ns": ns}
        if wanted:
            base["checkpoint_id"] = wanted
        before: RunnableConfig = {"configurable": {"checkpoint_id": self._pin_id()}}
        loaded = [t async for t in self._saver.alist({"configurable": base}, before=before, limit=1)]
        if not loaded:
            return None
        tuple_: CheckpointTuple = loaded[0]
        if not tuple_.pending_writes:
            return tuple_

        async def snapshot() -> list[Any]:
            return self._snapshot(tuple_)

        # Its pending writes may grow once this run commits: journal which it had.
        snap = await _journaled(LOAD_OP, snapshot)
        restored: CheckpointTuple = tuple_._replace(pending_writes=self._restore(tuple_, snap))
        return restored

    def _pin_id(self) -> str:
        assert self._pin is not None
        return str(self._pin.config["configurable"]["checkpoint_id"])

    async def _start(self, config: RunnableConfig) -> None:
        self._started = True
        saver = self._saver

        async def start() -> dict[str, Any]:
            # the saver's start checks and admission; the lease is the run's, not this
            # attempt's call: the commit releases it
            found, held = await saver.astart_journaled_run(config)
            lease = None if held is None else [held.thread_id, held.run_id, held.attempt]
            if found is None:
                return {"checkpoint_id": None, "lease": lease}
            return {
                "checkpoint_id": found.config["configurable"]["checkpoint_id"],
                "attempt": found.config["configurable"].get(ATTEMPT_KEY),
                "writes": self._snapshot(found),
                "lease": lease,
            }

        pinned = await _journaled(START_OP, start)
        if pinned.get("lease"):
            # Every execution of the run holds the lease until the commit: keep it alive
            # while this one runs (a replay as much as the first).
            self._held = HeldLease(*pinned["lease"])
            saver.keep_lease(self._held)
        if not pinned.get("checkpoint_id"):
            return
        conf = config.get("configurable") or {}
        by_id: RunnableConfig = {
            "configurable": {
                "thread_id": conf["thread_id"],
                "checkpoint_ns": "",
                "checkpoint_id": pinned["checkpoint_id"],
            }
        }
        found = await saver.aget_tuple(by_id)
        if found is None:
            raise NondeterminismError(
                f"checkpoint {pinned['checkpoint_id']}, which this run started from, is gone "
                f"from thread {conf['thread_id']!r} (deleted or pruned while the run was in "
                "flight), so the run cannot be replayed. Fix: do not prune or delete threads "
                "with a run in flight."
            )
        metadata = found.metadata
        raw = (config.get("metadata") or {}).get(RUN_ID_KEY)
        if raw is not None and not isinstance(raw, str) and metadata.get(RUN_ID_KEY) == str(raw):
            metadata = {**metadata, RUN_ID_KEY: raw}  # LangGraph compares it as given
        # What the run loaded (HEAD_KEY), from the pinned checkpoint itself: the run's first
        # write tells from it whether the previous run had finished (contract.guard_put).
        mark = head_mark(pinned["checkpoint_id"], found.metadata, found.checkpoint)
        self._pin = found._replace(
            config={
                **found.config,
                "configurable": {
                    **found.config["configurable"],
                    ATTEMPT_KEY: pinned["attempt"],
                    HEAD_KEY: mark,
                },
            },
            metadata=metadata,
            pending_writes=self._restore(found, pinned["writes"]),
        )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """What Postgres holds (this run's writes are stored when it commits)."""
        async for item in self._saver.alist(config, filter=filter, before=before, limit=limit):
            yield item

    # -- writes ---------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._log.append(("put", config, checkpoint, metadata, new_versions))
        return await self._mem.aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._log.append(("writes", config, list(writes), task_id, task_path))
        await self._mem.aput_writes(config, writes, task_id, task_path)

    def get_next_version(self, current: str | None, channel: None) -> str:
        return str(self._saver.get_next_version(current, channel))

    # -- the commit -----------------------------------------------------------------------

    def can_commit(self) -> bool:
        sched = current_scheduler()
        return sched is not None and sched.fatal is None

    async def commit(self, output: Any, *, keep_output: bool = True, ended: str = "ok") -> Any:
        """Store the run's writes once and end the run (its lease released as ``ended``:
        ``ok`` when the graph returned, ``error`` when it raised); return the output of
        the execution that did."""
        saver, log, serde = self._saver, self._log, self.serde
        release = None if self._held is None else (self._held, ended)

        async def commit() -> dict[str, Any]:
            continued_by = await saver.aput_batch(log, release=release)
            encoded = None
            if keep_output:
                try:
                    encoded = _encode(serde, output)
                except Exception:  # not serialisable: this execution's output is returned
                    encoded = None
            return {"continued_by": continued_by, "output": encoded}

        done = await _journaled(COMMIT_OP, commit)
        self.close()
        if done.get("output") is None:
            return output
        return _decode(serde, done["output"])

    def close(self) -> None:
        """This execution is over: stop renewing the lease. Without a commit (an attempt
        suspended or killed) it stays held, for the run's next attempt or until it expires."""
        if self._held is not None:
            self._saver.keep_lease(self._held, alive=False)

    # -- the sync API is not used by async runs -------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        raise NotImplementedError("DeterministicRunner runs graphs with the async API only")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        raise NotImplementedError("DeterministicRunner runs graphs with the async API only")

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        raise NotImplementedError("DeterministicRunner runs graphs with the async API only")

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        raise NotImplementedError("DeterministicRunner runs graphs with the async API only")


__all__ = ["COMMIT_OP", "LOAD_OP", "START_OP", "JournaledCheckpointer", "journaled_graph"]
