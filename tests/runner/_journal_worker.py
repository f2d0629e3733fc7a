"""One graph run on PostgresJournal in its own OS process:
``python -m tests.runner._journal_worker DSN SHAPE THREAD RUN``.

Every op function logs ``start:<op>`` / ``done:<op>`` rows to ``journal_effects`` (with
the server's clock and this process's pid). Env ``LGD_PAUSE_OP=<op>`` makes that op stall
after logging its start, until the file ``LGD_RELEASE`` exists; ``LGD_JITTER=1`` makes
every op sleep up to 50 ms (races); ``LGD_GO=<file>`` makes the worker signal
``<file>.<pid>`` once ready and wait for ``<file>`` before it starts the run. Prints the journal stats as JSON on the
last line. Exit codes: 0 done, 3 ConcurrentRunError, 4 another DeterministicError.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import random
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import psycopg
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from langgraph_deterministic import (
    ConcurrentRunError,
    DeterministicError,
    DeterministicSaver,
    run_config,
)
from langgraph_deterministic.runner import (
    DeterministicRunner,
    PostgresJournal,
    durable,
    durable_sync,
    idempotency_key,
)

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS journal_effects (thread TEXT, pid INT, what TEXT, "
    "idem TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp())"
)


class S(TypedDict, total=False):
    r: Annotated[list[Any], operator.add]
    branch: int


class Effects:
    def __init__(self, dsn: str, thread: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.thread = thread

    def log(self, what: str, idem: str | None = None) -> None:
        self.conn.execute(
            "INSERT INTO journal_effects (thread, pid, what, idem) VALUES (%s, %s, %s, %s)",
            (self.thread, os.getpid(), what, idem),
        )


def make_op(effects: Effects) -> Any:
    pause = os.environ.get("LGD_PAUSE_OP")
    release = Path(os.environ.get("LGD_RELEASE", "/nonexistent"))
    jitter = os.environ.get("LGD_JITTER") == "1"

    def op(name: str) -> str:
        effects.log(f"start:{name}", idempotency_key())
        if jitter:
            time.sleep(random.uniform(0, 0.05))
        if name == pause or (pause and name.endswith(f":{pause}")):
            while not release.exists():
                time.sleep(0.02)
        effects.log(f"done:{name}")
        return f"v:{name}"

    return op


def build(shape: str, op: Any) -> Any:
    g = StateGraph(S)
    if shape == "seq":  # sync nodes, runner.invoke

        def work(state: S) -> S:
            return {"r": [durable_sync("op1", op, "op1"), durable_sync("op2", op, "op2")]}

        g.add_node("work", work)
        g.add_edge(START, "work")
        g.add_edge("work", END)
        return g
    if shape == "fanout":  # 5 parallel Send branches, async

        async def branch(state: S) -> S:
            b = state["branch"]
            first = await durable("op1", asyncio.to_thread, op, f"b{b}:op1")
            second = await durable("op2", asyncio.to_thread, op, f"b{b}:op2")
            return {"r": [first, second]}

        g.add_node("branch", branch)
        g.add_conditional_edges(START, lambda s: [Send("branch", {"branch": i}) for i in range(5)])
        g.add_edge("branch", END)
        return g
    if shape == "subgraph":  # the ops run in a node of a nested subgraph

        async def inner(state: S) -> S:
            first = await durable("op1", asyncio.to_thread, op, "op1")
            second = await durable("op2", asyncio.to_thread, op, "op2")
            return {"r": [first, second]}

        leaf = StateGraph(S)
        leaf.add_node("inner", inner)
        leaf.add_edge(START, "inner")
        mid = StateGraph(S)
        mid.add_node("leaf", leaf.compile())
        mid.add_edge(START, "leaf")
        g.add_node("prep", lambda s: {"branch": 0})
        g.add_node("mid", mid.compile())
        g.add_edge(START, "prep")
        g.add_edge("prep", "mid")
        return g
    if shape == "chain":  # op1 in one node, op2 in the next: op2 skips its claim

        async def n1(state: S) -> S:
            return {"r": [await durable("op1", asyncio.to_thread, op, "op1")]}

        async def n2(state: S) -> S:
            return {"r": [await durable("op2", asyncio.to_thread, op, "op2")]}

        g.add_node("n1", n1)
        g.add_node("n2", n2)
        g.add_edge(START, "n1")
        g.add_edge("n1", "n2")
        return g
    if shape == "gather":  # one op, then asyncio.gather of 3 ops in one node

        async def node(state: S) -> S:
            first = await durable("op1", asyncio.to_thread, op, "op1")
            rest = await asyncio.gather(
                *(durable(f"g{i}", asyncio.to_thread, op, f"g{i}") for i in (1, 2, 3))
            )
            return {"r": [first, *rest]}

        g.add_node("node", node)
        g.add_edge(START, "node")
        return g
    raise SystemExit(f"unknown shape {shape}")


def main() -> int:
    dsn, shape, thread, run = sys.argv[1:5]
    effects = Effects(dsn, thread)
    graph_builder = build(shape, make_op(effects))
    stats: Any = None
    code = 0
    go = os.environ.get("LGD_GO")
    if go:  # a start barrier: racing workers begin the run together
        Path(f"{go}.{os.getpid()}").touch()
        while not Path(go).exists():
            time.sleep(0.005)
    try:
        if shape == "seq":
            with DeterministicSaver(dsn) as saver:
                runner = DeterministicRunner(journal=PostgresJournal(saver))
                graph = graph_builder.compile(checkpointer=saver)
                try:
                    out = runner.invoke(graph, {"r": []}, run_config(thread, run), durability="sync")
                finally:
                    stats = runner.last_stats
        else:

            async def go() -> Any:
                nonlocal stats
                async with DeterministicSaver(dsn) as saver:
                    runner = DeterministicRunner(journal=PostgresJournal(saver))
                    graph = graph_builder.compile(checkpointer=saver)
                    try:
                        return await runner.ainvoke(
                            graph, {"r": []}, run_config(thread, run), durability="sync"
                        )
                    finally:
                        stats = runner.last_stats

            out = asyncio.run(go())
        print(json.dumps(sorted(out["r"])))
    except ConcurrentRunError as exc:
        print(f"ConcurrentRunError: {exc}", file=sys.stderr)
        code = 3
    except DeterministicError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        code = 4
    if stats is not None:
        print(
            json.dumps(
                {
                    "attempt": stats.attempt,
                    "executed": stats.executed,
                    "replayed": stats.replayed,
                    "fenced": stats.fenced,
                    "ahead": stats.ahead,
                    "claimed_at": {k: v.isoformat() for k, v in stats.claimed_at.items()},
                }
            )
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
