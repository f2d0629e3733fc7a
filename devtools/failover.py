"""One failover trial: graph runs in flight on a primary with a streaming standby, the
primary stopped with ``-m immediate`` and the standby promoted, every run retried until it
finishes; then the database is checked.

The runs are what a worker does: ``run_config(thread, run)``, retried with the same run id
and input whenever :func:`langgraph_deterministic.errors.is_retryable` says so, one
attempt of a run at a time (so a ``ConcurrentRunError`` here never had a second attempt to
lose to: it is counted as false). When a later run finds its predecessor unfinished
(``RunUnfinishedError``: the predecessor's last checkpoints were lost with an asynchronous
standby), the predecessor is retried with its run id first, as the error says.

Used by ``tests/contract/test_failover.py`` (one small trial per replication mode) and
``benchmarks/failover_trials.py`` (many trials).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import operator
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from devtools.replica import Mode, ReplicaPair, start_replica_pair
from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    RunUnfinishedError,
    is_retryable,
)

LEASE_TTL = 3.0


class _S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


@dataclass
class TrialResult:
    mode: str
    journal: bool
    lag_ms: float
    runs: int = 0
    finished: int = 0
    attempts: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    fatal: list[str] = field(default_factory=list)
    false_concurrent: int = 0
    concurrent_messages: list[str] = field(default_factory=list)
    duplicated_inputs: int = 0
    missing_inputs: int = 0
    stuck_threads: int = 0
    forks: int = 0
    missing_parents: int = 0
    reopened_runs: int = 0  # finished (returned) runs the failover made unfinished again
    ops_rerun_after_return: int = 0  # journaled ops whose durable() had returned, run again
    failover_s: float = 0.0
    wall_s: float = 0.0

    def bad(self) -> dict[str, Any]:
        """What must be zero. A run whose every write fell inside the replication lag is
        lost with an asynchronous standby (its input is missing): bad only when sync."""
        return {
            "unfinished": self.runs - self.finished,
            "fatal": len(self.fatal),
            "false_concurrent": self.false_concurrent,
            "duplicated_inputs": self.duplicated_inputs,
            "missing_inputs": self.missing_inputs if self.mode == "sync" else 0,
            "stuck_threads": self.stuck_threads,
            "forks": self.forks,
            "missing_parents": self.missing_parents,
        }


def _unfinished_run(exc: RunUnfinishedError) -> str | None:
    """The run a RunUnfinishedError names (its message: "The previous run on thread 't',
    'run', ...")."""
    found = re.search(r"The previous run on thread '[^']*', '([^']*)'", str(exc))
    return found.group(1) if found else None


def _count(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


class _Ops:
    """The ops' executions, and which of them a durable() call returned."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: collections.Counter[str] = collections.Counter()
        self.returned: set[str] = set()
        self.rerun_after_return = 0

    def ran(self, key: str) -> None:
        with self.lock:
            self.runs[key] += 1
            if key in self.returned:
                self.rerun_after_return += 1

    def acknowledged(self, key: str) -> None:
        with self.lock:
            self.returned.add(key)


def _build(journal: bool, ops: _Ops, slow: float) -> Any:
    from langgraph_deterministic.runner import durable

    async def call(key: str) -> str:
        ops.ran(key)
        await asyncio.sleep(random.uniform(0.002, slow))
        return key

    def node(name: str) -> Any:
        async def fn(state: _S, config: RunnableConfig) -> _S:
            run = config["metadata"]["run_id"]
            key = f"{config['configurable']['thread_id']}/{run}/{name}"
            if journal:
                value: str = await durable(name, call, key)
                ops.acknowledged(key)
            else:
                value = await call(key)
            return {"log": [value]}

        return fn

    g = StateGraph(_S)
    names = ["a", "b", "c"]
    for name in names:
        g.add_node(name, node(name))
    g.add_edge(START, names[0])
    for first, second in itertools.pairwise(names):
        g.add_edge(first, second)
    g.add_edge(names[-1], END)
    return g


async def run_trial(
    mode: Mode,
    *,
    journal: bool,
    lag_ms: float = 0.0,
    threads: int = 3,
    runs_per_thread: int = 4,
    failover_after: tuple[float, float] = (0.15, 0.7),
    slow: float = 0.06,
    pair: ReplicaPair | None = None,
    seed: int | None = None,
    durability: str = "async",
) -> TrialResult:
    """Start a pair (unless given), run the trial, stop the pair; see the module docstring.

    ``threads`` threads of ``runs_per_thread`` runs each (three nodes, one op each, up to
    ``slow`` seconds); the failover comes once a share of the trial's ops, drawn from
    ``failover_after``, has started. ``durability`` is LangGraph's."""
    rng = random.Random(seed)
    own = pair is None
    if pair is None:
        pair = await asyncio.to_thread(start_replica_pair, mode, lag_ms=lag_ms)
    result = TrialResult(mode=mode, journal=journal, lag_ms=lag_ms)
    t0 = time.monotonic()
    try:
        dsn = await asyncio.to_thread(pair.create_database, f"ha_{uuid.uuid4().hex[:8]}")
        await _trial(pair, dsn, result, journal, threads, runs_per_thread, failover_after,
                     slow, rng, durability)  # fmt: skip
    finally:
        if own:
            await asyncio.to_thread(pair.stop)
    result.wall_s = time.monotonic() - t0
    return result


async def _trial(
    pair: ReplicaPair,
    dsn: str,
    result: TrialResult,
    journal: bool,
    n_threads: int,
    runs_per_thread: int,
    failover_after: tuple[float, float],
    slow: float,
    rng: random.Random,
    durability: str,
) -> None:
    from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal

    ops = _Ops()
    builder = _build(journal, ops, slow)
    async with DeterministicSaver(
        dsn, lease_ttl=LEASE_TTL, pool_max_size=n_threads + 2,
        connect_kwargs={"keepalives": 1, "keepalives_idle": 2, "keepalives_interval": 1,
                        "keepalives_count": 2},
    ) as saver:  # fmt: skip
        await saver.asetup()
        await asyncio.to_thread(pair.wait_caught_up)
        graph = builder.compile(checkpointer=saver)
        runner = DeterministicRunner(journal=PostgresJournal(saver)) if journal else None

        async def invoke(thread: str, run: str) -> None:
            config = run_config(thread, run)
            inputs = {"log": [f"in:{run}"]}
            if runner is not None:
                await runner.ainvoke(graph, inputs, config, durability=durability)
            else:
                await graph.ainvoke(inputs, config, durability=durability)

        async def attempt_until_done(thread: str, run: str, depth: int = 0) -> bool:
            for _ in range(60):
                result.attempts += 1
                try:
                    await invoke(thread, run)
                    return True
                except ConcurrentRunError as exc:
                    result.false_concurrent += 1  # one attempt at a time: nobody to lose to
                    _count(result.errors, type(exc).__name__)
                    result.concurrent_messages.append(f"{run}: {exc}")
                except RunUnfinishedError as exc:
                    # What the error says: retry the unfinished run it names, then this one.
                    _count(result.errors, type(exc).__name__)
                    named = _unfinished_run(exc)
                    if named is None or named == run or depth > 5:
                        result.fatal.append(f"{run}: {exc}")
                        return False
                    result.reopened_runs += 1
                    if not await attempt_until_done(thread, named, depth + 1):
                        return False
                    continue
                except Exception as exc:
                    _count(result.errors, type(exc).__name__)
                    if not is_retryable(exc):
                        result.fatal.append(f"{run}: {type(exc).__name__}: {exc}")
                        return False
                await asyncio.sleep(0.1 + rng.uniform(0, 0.1))
            result.fatal.append(f"{run}: gave up after 60 attempts")
            return False

        async def worker(thread: str) -> None:
            for i in range(runs_per_thread):
                result.runs += 1
                if await attempt_until_done(thread, f"{thread}-r{i}"):
                    result.finished += 1

        async def failover() -> None:
            # Mid-flight: once a random share of the trial's ops has started.
            total = n_threads * runs_per_thread * 3
            at = rng.randint(max(1, int(total * failover_after[0])), int(total * failover_after[1]))
            while sum(ops.runs.values()) < at:
                await asyncio.sleep(0.002)
            result.failover_s = await asyncio.to_thread(pair.failover)

        threads = [f"t{i}-{uuid.uuid4().hex[:6]}" for i in range(n_threads)]
        await asyncio.gather(failover(), *(worker(t) for t in threads))

        # After the trial: every thread takes a new run (nothing stuck), following what
        # the errors say (a retryable one: retry; RunUnfinishedError: retry the previous run).
        for thread in threads:
            before = len(result.fatal)
            if not await attempt_until_done(thread, f"{thread}-after"):
                result.stuck_threads += 1
                result.fatal[before:] = [f"{thread} stuck: {m}" for m in result.fatal[before:]]

        for thread in threads:
            state = await graph.aget_state({"configurable": {"thread_id": thread}})
            log = collections.Counter(state.values.get("log", []))
            for i in range(runs_per_thread):
                seen = log[f"in:{thread}-r{i}"]
                result.duplicated_inputs += max(0, seen - 1)
                result.missing_inputs += seen == 0
    result.ops_rerun_after_return = ops.rerun_after_return
    with psycopg.connect(dsn, autocommit=True) as conn:
        forks = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM checkpoints WHERE parent_checkpoint_id IS NOT "
            "NULL GROUP BY thread_id, checkpoint_ns, parent_checkpoint_id "
            "HAVING count(*) > 1) f"
        ).fetchone()
        orphans = conn.execute(
            "SELECT count(*) FROM checkpoints c WHERE c.parent_checkpoint_id IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM checkpoints p WHERE p.thread_id = c.thread_id "
            "AND p.checkpoint_ns = c.checkpoint_ns AND p.checkpoint_id = c.parent_checkpoint_id)"
        ).fetchone()
    result.forks = int(forks[0]) if forks else -1
    result.missing_parents = int(orphans[0]) if orphans else -1


__all__ = ["LEASE_TTL", "TrialResult", "run_trial"]
