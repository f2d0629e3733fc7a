"""End-to-end: DeterministicSaver on Postgres as the checkpointer of a graph that
DeterministicRunner runs inside a Restate handler, one thread across three invocations.

Turn 1 (new input) runs plan -> [research, a parallel subgraph, approve] and stops at the
``interrupt()`` in approve; turn 2 resumes it with ``Command(resume="yes")``; turn 3 brings
new input. Each regime (forced replay after every step, no replay, kill -9 of the service
mid-invocation) must give: no journal mismatch and no hang, every side effect finished
once, the same outputs, state history and run ledger as the same three turns run directly
on the saver without Restate.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from langgraph_deterministic import DeterministicSaver, run_config

from . import restate_app
from .restate_server import RestateEnv
from .test_restate_e2e import (
    INVOCATION_TIMEOUT,
    _wait_for,
    attempts_of,
    effect_counts,
    invocation_row,
    runs_without_result,
)

pytestmark = pytest.mark.restate

TURNS: list[dict[str, Any]] = [
    {"turn": 1, "topic": "tides"},
    {"turn": 2, "resume": "yes"},
    {"turn": 3, "topic": "moons"},
]
# (regime, {turn: side effect held in flight when the service is killed})
REGIMES = [
    ("forced-replay", {}),
    ("no-replay", {}),
    ("no-replay", {1: "t1.research.op1", 2: "t2.act.yes"}),
    # under forced replay only the last op of a turn can be held alone (see test_restate_e2e)
    ("forced-replay", {2: "t2.join"}),
]


def _turn_effects(turn: int) -> list[str]:
    first = [f"t{turn}.{x}" for x in ("plan", "research.op0", "research.op1", "sub.l0", "sub.l1")]
    if turn == 1:
        return first  # approve stops at interrupt() before acting
    if turn == 2:
        return [f"t{turn}.act.yes", f"t{turn}.join"]  # only the interrupted branch resumes
    return [*first, f"t{turn}.act.yes", f"t{turn}.join"]


async def _reference(dsn: str, thread: str, effects: Path) -> list[dict[str, Any]]:
    """The same turns, directly on the saver: what the Restate runs must reproduce."""
    outs = []
    async with DeterministicSaver(dsn) as saver:
        graph = restate_app.hitl_graph(saver)
        for spec in TURNS:
            req = {**spec, "effects": str(effects), "gate": None}
            restate_app._REQ["current"] = req
            cfg = run_config(thread, f"{thread}:turn{spec['turn']}")
            outs.append(restate_app.hitl_output(await graph.ainvoke(restate_app.hitl_input(req), cfg)))
    return outs


async def _thread_facts(dsn: str, thread: str) -> dict[str, Any]:
    async with DeterministicSaver(dsn) as saver:
        graph = restate_app.hitl_graph(saver)
        history = []
        async for snap in graph.aget_state_history({"configurable": {"thread_id": thread}}):
            history.append((
                snap.metadata.get("step") if snap.metadata else None,
                snap.metadata.get("source") if snap.metadata else None,
                snap.next,
                snap.values,
                sorted((t.name, [i.value for i in t.interrupts]) for t in snap.tasks),
            ))
        runs = {}
        for spec in TURNS:
            run_id = f"{thread}:turn{spec['turn']}"
            rec = await saver.aget_run(thread, run_id)
            runs[spec["turn"]] = None if rec is None else (rec.status, rec.attempts, rec.values)
        return {"history": history, "runs": runs}


@pytest.mark.parametrize(
    ("regime", "held"), REGIMES, ids=["forced-replay", "no-replay", "kill9", "forced-replay-kill9"]
)
def test_saver_thread_across_invocations(
    restate_envs: Any, dsn: str, regime: str, held: dict[int, str], tmp_path: Path
) -> None:
    env: RestateEnv = restate_envs.get(regime)
    thread = f"hitl-{uuid.uuid4().hex[:8]}"
    effects = tmp_path / "effects.log"
    outs = []
    for spec in TURNS:
        turn = spec["turn"]
        gate = tmp_path / f"gate{turn}"
        slow = [held[turn]] if turn in held else []
        req = {**spec, "dsn": dsn, "thread": thread, "run_id": f"{thread}:turn{turn}",
               "effects": str(effects), "gate": str(gate), "slow": slow}
        iid = env.send("hitl", req)
        if slow:
            _wait_for(lambda s=slow[0]: effect_counts(effects, "start")[s] >= 1, f"{slow} to start")
            _wait_for(lambda iid=iid: runs_without_result(env, iid) == 1, "the journal to settle")
            env.service.kill9()
            env.service.start()
            gate.touch()
        status, out = env.attach(iid, timeout=INVOCATION_TIMEOUT)
        row = invocation_row(env, iid)
        assert status == 200, (status, out, row, env.service.log_text()[-4000:])
        assert row["status"] == "completed" and row.get("completion_result") == "success", row
        assert row.get("last_failure_error_code") != 570, row
        if not slow:
            assert row.get("last_failure") is None, row  # no 570 (cleared once completed)
            if not env.forced_replay:  # nothing ends an attempt early: no retry of any kind
                mine = set(_turn_effects(turn))
                tags = {tag for label, tag in attempts_of(effects) if label in mine}
                assert len(tags) == 1, (tags, env.service.log_text()[-3000:])
        else:
            assert effect_counts(effects, "start")[slow[0]] == 2  # ran again: not journaled
        done = effect_counts(effects)
        expected = [e for t in range(1, turn + 1) for e in _turn_effects(t)]
        assert sorted(done) == sorted(expected), done
        assert all(n == 1 for n in done.values()), {k: n for k, n in done.items() if n != 1}
        outs.append(out)

    ref_thread = f"ref-{thread}"
    ref_outs = asyncio.run(_reference(dsn, ref_thread, tmp_path / "ref-effects.log"))
    for got, want in zip(outs, ref_outs, strict=True):
        assert got["results"] == want["results"] and got["summary"] == want["summary"]
        assert [v for _, v in got["interrupts"]] == [v for _, v in want["interrupts"]]
    assert outs[0]["interrupts"], outs[0]
    assert outs[2]["summary"] == "t3.join:ok|12"

    facts = asyncio.run(_thread_facts(dsn, thread))
    ref = asyncio.run(_thread_facts(dsn, ref_thread))
    assert facts["history"] == ref["history"]
    assert facts["runs"] == ref["runs"]
    assert all(r is not None and r[1] == 1 for r in facts["runs"].values()), facts["runs"]
    # The interrupt id the caller got is the one the thread holds (turn 2 resumed it).
    first_history = [h for h in facts["history"] if h[4] and any(i for _, i in h[4])]
    assert first_history
