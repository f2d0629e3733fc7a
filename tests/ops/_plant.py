"""Faults planted the way production plants them: real graph runs (tests/ops/_agent.py) on
PostgresSaver (and on DeterministicSaver for the ledger's fault), killed inside the tool
and retried as queues retry, through every input form of ``_agent.FORMS``.

``plant(dsn, form)`` adds one thread per kind for that form; it returns
``{thread_id: kind}``. The kinds:

``reapplied``   killed in the tool, retried with the same input (the model then 400s)
``unfinished``  killed in the tool, never retried
``orphan``      killed in the tool, then the user's next message (the model 400s)
``fork``        killed in the tool, then resumed by two attempts at once (a zombie, a retry)
``run``         DeterministicSaver under run_config, killed in the tool, never retried
``done``        one finished run (clean)
``repeat``      the same message twice, both answered (clean)
``interrupted`` waiting on ``interrupt()`` for a human (clean)
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Checkpointer
from tests.ops import _agent

from langgraph_deterministic import DeterministicSaver, run_config

DAMAGED = ("reapplied", "unfinished", "orphan", "fork", "run")
CLEAN = ("done", "repeat", "interrupted")


def question(thread_id: str) -> str:
    return f"what about {thread_id}?"


def _killed(graph: Any, inputs: Any, config: dict[str, Any]) -> None:
    _agent.KILL.set()
    try:
        with pytest.raises(_agent.WorkerKilled):
            graph.invoke(inputs, config, durability="sync")
    finally:
        _agent.KILL.clear()


def _at_once(graph: Any, cfg: dict[str, Any]) -> None:
    """The retry resumes the step while the first attempt, a zombie, still runs it: both
    read the same head and both write its next checkpoints."""
    _agent.MEET.append(threading.Barrier(2))
    try:
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(graph.invoke, None, cfg, durability="sync") for _ in "ab"]:
                done.result()
    finally:
        _agent.MEET.clear()


def plant_with(saver: Checkpointer, form: str, kinds: tuple[str, ...]) -> dict[str, str]:
    """Plant ``kinds`` (PostgresSaver-side kinds) through ``saver``."""
    make = _agent.FORMS[form]
    graph = _agent.build().compile(checkpointer=saver)
    out = {}
    for kind in kinds:
        tid = f"{form}-{kind}"
        out[tid] = kind
        cfg: dict[str, Any] = {"configurable": {"thread_id": tid}}

        def inputs(text: str = question(tid)) -> dict[str, Any]:
            # afresh per attempt, as a queue's retry deserialises it (add_messages gives
            # the first attempt's message objects an id, which would dedupe the second)
            return {"messages": make(text)}

        if kind == "done":
            graph.invoke(inputs(), cfg, durability="sync")
        elif kind == "repeat":
            graph.invoke(inputs(), cfg, durability="sync")
            graph.invoke(inputs(), cfg, durability="sync")
        elif kind == "interrupted":
            graph.invoke(inputs(f"please approve {tid}"), cfg, durability="sync")
            assert graph.get_state(cfg).interrupts
        else:
            _killed(graph, inputs(), cfg)
            if kind == "reapplied":
                with pytest.raises(_agent.ProviderError):
                    graph.invoke(
                        inputs(), cfg, durability="sync"
                    )  # the queue's retry: the same input again
            elif kind == "orphan":
                with pytest.raises(_agent.ProviderError):
                    graph.invoke(inputs(f"hello again from {tid}"), cfg, durability="sync")
            elif kind == "fork":
                _at_once(graph, cfg)
    return out


def plant_peer(dsn: str, form: str) -> dict[str, str]:
    """Every PostgresSaver kind for ``form``."""
    with PostgresSaver.from_conn_string(dsn) as saver:
        return plant_with(saver, form, tuple(k for k in DAMAGED + CLEAN if k != "run"))


def plant_ours(dsn: str, form: str) -> dict[str, str]:
    """The ``run`` kind for ``form`` (our tables must be there)."""
    with DeterministicSaver(dsn) as saver:
        graph = _agent.build().compile(checkpointer=saver)
        tid = f"{form}-run"
        _killed(graph, {"messages": _agent.FORMS[form](question(tid))}, run_config(tid, "r1"))
    return {tid: "run"}
