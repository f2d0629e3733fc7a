"""History that branches on purpose: time travel (replay, fork, update_state at a past
checkpoint) is allowed under policies "require" and "warn", each branch with its own run
id, while an attempt that merely lost a race is still fenced (one child per lineage)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.types import Command, StateUpdate, interrupt
from tests.contract.graphs import ask, build_pipeline, effects

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import ConcurrentRunError, RunIdRequiredError


def plain(thread: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, **extra}}


def children(db: str, thread: str, parent: str) -> list[tuple[str, str]]:
    with psycopg.connect(db) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT checkpoint_id, metadata ->> 'run_id' FROM checkpoints WHERE thread_id = %s "
            "AND checkpoint_ns = '' AND parent_checkpoint_id = %s ORDER BY checkpoint_id",
            (thread, parent),
        ).fetchall()


def latest(db: str, thread: str) -> str:
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''",
            (thread,),
        ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("policy", ["require", "warn"])
def test_replay_from_a_past_checkpoint_is_a_branch_of_its_own(db: str, policy: Any) -> None:
    thread = f"travel-{policy}"
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        first = graph.invoke(ask("q"), run_config(thread, "A"))
        history = list(graph.get_state_history(plain(thread)))
        old = history[-2].config["configurable"]["checkpoint_id"]  # the input's child
        ran = effects(db, thread)
        # Replay from there: a deliberate branch, with its own run id.
        replay = graph.invoke(None, run_config(thread, "replay-1", checkpoint_id=old))
        assert replay["messages"][-1].content == first["messages"][-1].content
        assert len(effects(db, thread)) > len(ran)  # the nodes after `old` ran again
        assert [r for _, r in children(db, thread, old)] == ["A", "replay-1"]
        # The head is LangGraph's: the latest checkpoint, the replay's final one.
        head = graph.get_state(plain(thread))
        assert head.config["configurable"]["checkpoint_id"] == latest(db, thread)
        assert head.metadata is not None and head.metadata["run_id"] == "replay-1"
        # A second branch from the same checkpoint, under another run id: allowed too.
        graph.invoke(None, run_config(thread, "replay-2", checkpoint_id=old))
        assert [r for _, r in children(db, thread, old)] == ["A", "replay-1", "replay-2"]
        # The thread goes on from the head as usual.
        more = graph.invoke(ask("more"), run_config(thread, "B"))
        assert more["messages"][-1].content.startswith("report of")


def test_update_state_at_a_past_checkpoint_forks(db: str, saver: DeterministicSaver) -> None:
    thread = "travel-fork"
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config(thread, "A"))
    history = list(graph.get_state_history(plain(thread)))
    old = history[-2].config
    fork = graph.update_state(
        {
            **run_config(thread, "fork-1"),
            "configurable": {**old["configurable"], "run_id": "fork-1"},
        },
        {"steps": ["edited"]},
    )
    assert len(children(db, thread, old["configurable"]["checkpoint_id"])) == 2
    out = graph.invoke(
        None, run_config(thread, "fork-run", checkpoint_id=fork["configurable"]["checkpoint_id"])
    )
    assert "edited" in out["steps"]


def test_a_race_inside_one_branch_is_still_fenced(db: str, saver: DeterministicSaver) -> None:
    """Two attempts of the same branch run from the same past checkpoint: one lineage,
    one child -- the second is a zombie."""
    thread = "travel-race"
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config(thread, "A"))
    old = list(graph.get_state_history(plain(thread)))[-2].config["configurable"]["checkpoint_id"]
    # Two attempts of run R load the same branch point (as LangGraph's loop would)...
    loads = []
    for _ in range(2):
        config = run_config(thread, "R", checkpoint_id=old)
        config["configurable"]["__pregel_runtime"] = object()
        loads.append(saver.get_tuple(config))
    first, second = loads
    assert first is not None and second is not None
    cfg1 = {"configurable": first.config["configurable"], "metadata": {"run_id": "R"}}
    cfg2 = {"configurable": second.config["configurable"], "metadata": {"run_id": "R"}}
    step = {"source": "loop", "step": 7, "parents": {}}
    cp1 = {**first.checkpoint, "id": f"1fffffff-ffff-6fff-bfff-{'1' * 12}"}
    cp2 = {**second.checkpoint, "id": f"1fffffff-ffff-6fff-bfff-{'2' * 12}"}
    saver.put(cfg1, cp1, step, {})  # type: ignore[arg-type]
    with pytest.raises(ConcurrentRunError):
        saver.put(cfg2, cp2, step, {})  # type: ignore[arg-type]
    assert [r for _, r in children(db, thread, old)] == ["A", "R"]


class _Sub(TypedDict):
    items: Annotated[list[str], operator.add]


def _nested(saver: DeterministicSaver, interrupting: bool = False) -> Any:
    """parent: before -> sub (a stateful subgraph: a -> b) -> after."""

    def a(state: _Sub) -> dict[str, list[str]]:
        return {"items": ["a"]}

    def b(state: _Sub) -> dict[str, list[str]]:
        if interrupting:
            return {"items": [f"b:{interrupt('answer?')}"]}
        return {"items": ["b"]}

    sub = StateGraph(_Sub)
    sub.add_node("a", a)
    sub.add_node("b", b)
    sub.add_edge(START, "a")
    sub.add_edge("a", "b")
    parent = StateGraph(_Sub)
    parent.add_node("before", lambda s: {"items": ["before"]})
    parent.add_node("sub", sub.compile(checkpointer=True))
    parent.add_node("after", lambda s: {"items": ["after"]})
    parent.add_edge(START, "before")
    parent.add_edge("before", "sub")
    parent.add_edge("sub", "after")
    return parent.compile(checkpointer=saver)


@pytest.mark.parametrize("policy", ["require", "warn"])
def test_a_branch_at_the_parent_continues_its_subgraphs(db: str, policy: Any) -> None:
    """Replaying the parent from a checkpoint before a stateful subgraph ran: the subgraph
    continues its own checkpoints under the branch's run id, a branch in every namespace
    it writes, not a zombie of the first run."""
    thread = f"travel-sub-{policy}"
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = _nested(saver)
        assert graph.invoke({"items": []}, run_config(thread, "A"))["items"][-1] == "after"
        history = list(graph.get_state_history(plain(thread)))
        at_sub = next(s for s in history if s.next == ("sub",))
        old = at_sub.config["configurable"]["checkpoint_id"]
        out = graph.invoke(None, run_config(thread, "replay-1", checkpoint_id=old))
        assert out["items"][-1] == "after"
        assert [r for _, r in children(db, thread, old)] == ["A", "replay-1"]
        out = graph.invoke(None, run_config(thread, "replay-2", checkpoint_id=old))
        assert out["items"][-1] == "after"
        assert [r for _, r in children(db, thread, old)] == ["A", "replay-1", "replay-2"]


# (policy, whether calls carry run ids): "warn" without them is how LangGraph's own tests
# (and a team adopting the saver) call it.
MODES = [("require", True), ("warn", True), ("warn", False)]


def call(thread: str, run: str, ids: bool, **configurable: Any) -> RunnableConfig:
    return run_config(thread, run, **configurable) if ids else plain(thread, **configurable)


@pytest.mark.parametrize(("policy", "ids"), MODES)
def test_a_branch_resumes_an_interrupted_subgraph_anew(db: str, policy: Any, ids: bool) -> None:
    """Time travel to the parent checkpoint at an interrupted subgraph, then a resume with
    another answer: the branch's subgraph takes the new answer (its writes are not fenced
    as a zombie's), the first run's history is kept. The branch's subgraph starts its
    namespace anew (nothing of it existed before that point): without run ids its first
    checkpoint is told apart from the first run's by the root's attempt token."""
    thread = f"travel-sub-interrupt-{policy}-{ids}"
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = _nested(saver, interrupting=True)
        graph.invoke({"items": []}, call(thread, "A", ids))
        first = graph.invoke(Command(resume="old"), call(thread, "A-resume", ids))
        assert "b:old" in first["items"] and first["items"][-1] == "after"
        history = list(graph.get_state_history(plain(thread)))
        at_sub = [s for s in history if s.next == ("sub",)][-1]  # the oldest: before sub ran
        old = at_sub.config["configurable"]["checkpoint_id"]
        paused = graph.invoke(None, call(thread, "B", ids, checkpoint_id=old))
        assert "__interrupt__" in paused
        out = graph.invoke(Command(resume="new"), call(thread, "B-resume", ids))
        assert "b:new" in out["items"] and "b:old" not in out["items"]
        assert out["items"][-1] == "after"


def test_a_subgraph_race_inside_a_branch_is_still_fenced(db: str) -> None:
    """Two attempts of the same branching run write the same subgraph checkpoint's child:
    the second is a zombie, in the subgraph's namespace too."""
    thread = "travel-sub-race"
    with DeterministicSaver(db) as saver:
        graph = _nested(saver)
        graph.invoke({"items": []}, run_config(thread, "A"))
        old = next(s for s in graph.get_state_history(plain(thread)) if s.next == ("sub",)).config[
            "configurable"
        ]["checkpoint_id"]
        config = run_config(thread, "R", checkpoint_id=old)
        config["configurable"]["__pregel_runtime"] = object()
        assert saver.get_tuple(config) is not None  # R branches at the root
        sub = {
            "configurable": {"thread_id": thread, "checkpoint_ns": "sub", "__pregel_runtime": 1},
            "metadata": {"run_id": "R"},
        }
        # The subgraph's first checkpoint, which run A continued already.
        with psycopg.connect(db) as conn:
            row = conn.execute(
                "SELECT min(checkpoint_id) FROM checkpoints WHERE thread_id = %s "
                "AND checkpoint_ns = 'sub'",
                (thread,),
            ).fetchone()
        assert row is not None
        sub["configurable"]["checkpoint_id"] = row[0]
        found = saver.get_tuple(sub)
        assert found is not None
        base = {**found.config, "metadata": {"run_id": "R"}}
        base["configurable"] = {**found.config["configurable"], "__pregel_runtime": 1}
        step = {"source": "loop", "step": 9, "parents": {}}
        cp1 = {**found.checkpoint, "id": f"1fffffff-ffff-6fff-bfff-{'1' * 12}"}
        cp2 = {**found.checkpoint, "id": f"1fffffff-ffff-6fff-bfff-{'2' * 12}"}
        saver.put(base, cp1, step, {})  # type: ignore[arg-type]  # R's branch in 'sub'
        with pytest.raises(ConcurrentRunError):
            saver.put(base, cp2, step, {})  # type: ignore[arg-type]  # R again: a race
        with psycopg.connect(db) as conn:
            slots = conn.execute(
                "SELECT parent_checkpoint_id, run_id FROM lgd_chain WHERE thread_id = %s "
                "AND checkpoint_ns = 'sub' AND parent_checkpoint_id LIKE %s ORDER BY 1",
                (thread, row[0] + "%"),
            ).fetchall()
        assert slots == [(row[0], "A"), (f"{row[0]}~R", "R")]


def _trails(saver: DeterministicSaver, seen: list[tuple[str, list[str]]]) -> Any:
    """parent: step -> outer (a stateful subgraph: note -> inner (stateful: note)): each
    subgraph records the state it starts from, so a test sees which checkpoint it loaded."""

    class Inner(TypedDict):
        inner: Annotated[list[str], operator.add]

    class Outer(TypedDict):
        outer: Annotated[list[str], operator.add]

    def note_inner(state: Inner) -> dict[str, list[str]]:
        seen.append(("inner", list(state["inner"])))
        return {"inner": ["i"]}

    def note_outer(state: Outer) -> dict[str, list[str]]:
        seen.append(("outer", list(state["outer"])))
        return {"outer": ["o"]}

    inner = StateGraph(Inner).add_node("note", note_inner).add_edge(START, "note")
    outer = StateGraph(Outer).add_node("note", note_outer)
    outer.add_node("inner", inner.compile(checkpointer=True))
    outer.add_edge(START, "note").add_edge("note", "inner")
    parent = StateGraph(_Sub).add_node("step", lambda s: {"items": ["p"]})
    parent.add_node("outer", outer.compile(checkpointer=True))
    parent.add_edge(START, "step").add_edge("step", "outer")
    return parent.compile(checkpointer=saver)


@pytest.mark.parametrize(("policy", "ids"), MODES)
def test_replay_from_before_a_subgraph_ever_ran_starts_it_empty(
    db: str, policy: Any, ids: bool
) -> None:
    """Two runs, then a replay from the first run's checkpoint before its subgraphs ran:
    the subgraphs start from nothing (LangGraph reloads the state they had before that
    point), writing first checkpoints of namespaces the first run started already."""
    thread = f"travel-empty-{policy}-{ids}"
    seen: list[tuple[str, list[str]]] = []
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = _trails(saver, seen)
        graph.invoke({"items": []}, call(thread, "A", ids))
        graph.invoke({"items": []}, call(thread, "B", ids))
        assert seen[-2:] == [("outer", ["o"]), ("inner", ["i"])]
        history = list(graph.get_state_history(plain(thread)))
        oldest = [s for s in history if s.next == ("outer",)][-1]
        seen.clear()
        graph.invoke(None, call(thread, "R", ids, **_address(oldest.config)))
        assert seen == [("outer", []), ("inner", [])]
        with psycopg.connect(db) as conn:
            roots = conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = "
                "'outer' AND parent_checkpoint_id IS NULL",
                (thread,),
            ).fetchone()
        assert roots == (2,)  # the first run's and the replay's: two lineages


def _address(config: RunnableConfig) -> dict[str, Any]:
    return {"checkpoint_id": config["configurable"]["checkpoint_id"]}


@pytest.mark.parametrize(("policy", "ids"), MODES)
def test_a_run_from_a_fork_loads_its_subgraphs_from_before_the_fork(
    db: str, policy: Any, ids: bool
) -> None:
    """update_state at a past checkpoint makes a fork, the thread's latest checkpoint; a
    run addressed at it travels in time all the same (LangGraph has its subgraphs reload
    their state from before the fork point, checkpoints the second run continued), so the
    root's mark reaches the subgraphs though the root itself continues the head."""
    thread = f"travel-fork-sub-{policy}-{ids}"
    seen: list[tuple[str, list[str]]] = []
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = _trails(saver, seen)
        graph.invoke({"items": []}, call(thread, "A", ids))
        graph.invoke({"items": []}, call(thread, "B", ids))
        history = list(graph.get_state_history(plain(thread)))
        second = next(s for s in history if s.next == ("step",))  # before B's step
        fork = graph.update_state(
            call(thread, "edit", ids, **_address(second.config)), {"items": ["forked"]}
        )
        assert fork["configurable"]["checkpoint_id"] == latest(db, thread)
        seen.clear()
        out = graph.invoke(None, call(thread, "F", ids, **_address(fork)))
        assert seen == [("outer", ["o"]), ("inner", ["i"])]  # as after A, not after B
        assert "forked" in out["items"]
        # And on from there: the next run sees the fork's subgraph state.
        seen.clear()
        graph.invoke({"items": []}, call(thread, "C", ids))
        assert seen == [("outer", ["o", "o"]), ("inner", ["i", "i"])]


@pytest.mark.parametrize(("policy", "ids"), MODES)
def test_a_copy_of_the_first_checkpoint_is_a_second_root(db: str, policy: Any, ids: bool) -> None:
    """update_state(as_node="__copy__") of a thread's first checkpoint copies it as its
    sibling, a second checkpoint without parent (LangGraph's fork of the start state):
    a deliberate branch at the first-checkpoint slot, and runs go on from it."""
    thread = f"travel-copy-{policy}-{ids}"
    with DeterministicSaver(db, run_id_policy=policy) as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        graph.invoke(ask("q"), call(thread, "A", ids))
        first = list(graph.get_state_history(plain(thread)))[-1]
        assert first.parent_config is None
        copy = graph.update_state(
            call(thread, "copy", ids, **_address(first.config)), None, as_node="__copy__"
        )
        copied = graph.get_state(plain(thread, **_address(copy)))
        assert copied.parent_config is None
        # LangGraph writes the copy with the loaded tuple's config, not the caller's: the
        # caller's run id is kept all the same (refused as missing under "require" else).
        assert copied.metadata is not None
        assert copied.metadata.get("run_id") == ("copy" if ids else None)
        out = graph.invoke(ask("again"), call(thread, "B", ids))
        assert out["messages"][-1].content.startswith("report of")
        with psycopg.connect(db) as conn:
            roots = conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                "AND parent_checkpoint_id IS NULL",
                (thread,),
            ).fetchone()
        assert roots == (2,)


def test_two_first_checkpoints_of_graph_runs_are_still_fenced(db: str) -> None:
    """The first-checkpoint slot opens only to deliberate writes: two attempts of a graph
    run writing a new thread's first checkpoint get one between them."""
    with DeterministicSaver(db, run_id_policy="warn") as saver:
        loads = []
        for _ in range(2):
            config = plain("travel-first-race", __pregel_runtime=object())
            assert saver.get_tuple(config) is None
            loads.append(config)
        step = {"source": "input", "step": -1, "parents": {}}
        for n, config in enumerate(loads, 1):
            cp = {
                "v": 4, "id": f"1fffffff-ffff-6fff-bfff-{str(n) * 12}", "ts": "",
                "channel_values": {}, "channel_versions": {}, "versions_seen": {},
            }  # fmt: skip
            if n == 1:
                saver.put(config, cp, step, {})  # type: ignore[arg-type]
            else:
                with pytest.raises(ConcurrentRunError):
                    saver.put(config, cp, step, {})  # type: ignore[arg-type]


def test_bulk_update_state_keeps_the_run_id_across_its_supersteps(
    db: str, saver: DeterministicSaver
) -> None:
    """bulk_update_state hands each superstep the config the saver returned for the last
    one (thread, namespace, checkpoint: as the peer's), then writes pending writes with
    it: under "require" every write of it carries the caller's run id all the same, and
    a plain write after it still needs one of its own."""
    thread = "travel-bulk"
    graph = build_pipeline(db).compile(checkpointer=saver)
    graph.invoke(ask("q"), run_config(thread, "A"))
    old = list(graph.get_state_history(plain(thread)))[-2].config
    done = graph.bulk_update_state(
        run_config(thread, "bulk", **_address(old)),
        [[StateUpdate({"steps": ["one"]})], [StateUpdate({"steps": ["two"]})]],
    )
    with psycopg.connect(db) as conn:
        runs = conn.execute(
            "SELECT metadata ->> 'run_id' FROM checkpoints WHERE thread_id = %s AND "
            "checkpoint_ns = '' AND metadata ->> 'source' = 'update' ORDER BY checkpoint_id",
            (thread,),
        ).fetchall()
    assert runs == [("bulk",), ("bulk",)]
    assert "two" in graph.get_state(plain(thread, **_address(done))).values["steps"]
    with pytest.raises(RunIdRequiredError):
        graph.update_state(plain(thread), {"steps": ["three"]})


def test_update_state_without_checkpoint_id_continues_the_head(db: str) -> None:
    """update_state without checkpoint_id, as on LangGraph's saver: a child of the head on
    a quiet thread (its main slot, no fork); raced by a run that continued the head
    meanwhile, both kept, as PostgresSaver keeps them; refused while a run holds the
    thread's lease."""
    thread = "travel-unaddressed"
    with DeterministicSaver(db, run_id_policy="warn") as saver:
        graph = build_pipeline(db).compile(checkpointer=saver)
        graph.invoke(ask("q"), run_config(thread, "A"))
        head = latest(db, thread)
        done = graph.update_state(run_config(thread, "edit-1"), {"steps": ["by hand"]})
        assert [c for c, _ in children(db, thread, head)] == [done["configurable"]["checkpoint_id"]]
        with psycopg.connect(db) as conn:
            slots = conn.execute(
                "SELECT parent_checkpoint_id FROM lgd_chain WHERE thread_id = %s "
                "AND checkpoint_ns = '' AND parent_checkpoint_id LIKE %s",
                (thread, head + "%"),
            ).fetchall()
        assert slots == [(head,)]
        # A race: a graph run (no lease: a plain config) continues the head between
        # update_state's read and its write.
        head = latest(db, thread)
        loaded = saver.get_tuple(plain(thread))
        assert loaded is not None
        run = saver.get_tuple(plain(thread, __pregel_runtime=object()))
        assert run is not None
        step = {"source": "loop", "step": 50, "parents": {}}
        ids = [f"1fffffff-ffff-6fff-bfff-{str(n) * 12}" for n in (1, 2)]
        saver.put(run.config, {**run.checkpoint, "id": ids[0]}, step, {})  # type: ignore[arg-type]
        meta = {"source": "update", "step": 50, "parents": {}}
        saver.put(loaded.config, {**loaded.checkpoint, "id": ids[1]}, meta, {})  # type: ignore[arg-type]
        assert [c for c, _ in children(db, thread, head)] == ids
        # A run holding the lease (run_config) refuses the update.
        admitted = run_config(thread, "B")
        admitted["configurable"]["__pregel_runtime"] = object()
        assert saver.get_tuple(admitted) is not None
        before = latest(db, thread)
        with pytest.raises(ConcurrentRunError, match="took the thread over"):
            graph.update_state(run_config(thread, "edit-2"), {"steps": ["late"]})
        assert latest(db, thread) == before
