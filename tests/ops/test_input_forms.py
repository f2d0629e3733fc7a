"""audit and repair read messages as LangGraph does, whatever form the input came in.

A PostgresSaver database where real graph runs (tests/ops/_plant.py) planted every fault
class through every input form LangGraph accepts: audit finds every fault, ``repair
--apply`` fixes every one, a second audit is clean, each re-applied input is in the state
once, every repaired thread takes new input with a model that rejects unanswered tool
calls, and the clean threads are unchanged byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from tests.ops import _agent, _plant

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic._messages import as_messages, input_readings, key
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops.repair import UNKNOWN_RESULT

FORMS = sorted(_agent.FORMS)
EXPECTED = {  # kind -> what audit must report (no_run_id: a risk, not damage)
    "reapplied": {"reapplied_input", "unanswered_tool_call", "unfinished_step", "no_run_id"},
    "unfinished": {"unfinished_step", "no_run_id"},
    "orphan": {"unanswered_tool_call", "unfinished_step", "no_run_id"},
    "fork": {"forked_history", "no_run_id"},
    "run": {"unfinished_step", "unfinished_run"},
    "done": {"no_run_id"},
    "repeat": {"no_run_id"},
    "interrupted": {"no_run_id"},
}
_SERDE = JsonPlusSerializer()


# --- the coercion, without a database -------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(text=st.text(min_size=1, max_size=40), form=st.sampled_from(FORMS))
def test_a_stored_input_reads_as_the_messages_langgraph_applied(text: str, form: str) -> None:
    value = _agent.FORMS[form](text)
    applied = add_messages([], value)  # what the graph's state got
    stored = _SERDE.loads_typed(_SERDE.dumps_typed(value))  # what checkpoint_writes holds
    readings = input_readings(stored)
    assert [key(m) for m in applied] in [[key(m) for m in r] for r in readings]
    # the first reading is LangGraph's own for every form but a bare tuple, which the serde
    # turns into a list of two items
    assert (readings[0] == [] or [key(m) for m in readings[0]] == [key(m) for m in applied]) or (
        form == "bare_tuple"
    )


def test_as_messages_reads_state_forms_and_refuses_what_langgraph_refuses() -> None:
    call = {"name": "f", "args": {}, "id": "c1", "type": "tool_call"}
    stored = _SERDE.loads_typed(
        _SERDE.dumps_typed(
            [("user", "hi"), {"role": "assistant", "content": "", "tool_calls": [call]}]
        )
    )
    messages = as_messages(stored)
    assert messages is not None
    assert [type(m) for m in messages] == [HumanMessage, AIMessage]
    assert messages[1].tool_calls[0]["id"] == "c1"
    assert as_messages([{"no": "role"}]) is None and as_messages(None) is None
    original = HumanMessage("x")
    as_messages([original])
    assert original.id is None  # the caller's objects are not given ids


# --- a planted database -----------------------------------------------------------------


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def rows_of(dsn: str, threads: list[str]) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [
            conn.execute(
                f"SELECT * FROM {table} WHERE thread_id = ANY(%s) ORDER BY 1, 2, 3, 4, 5",
                (threads,),
            ).fetchall()
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
        ]


@pytest.fixture(scope="module")
def planted(pg_server_dsn: str) -> Iterator[dict[str, Any]]:
    dsn = create_database(pg_server_dsn, prefix="lgd_forms")
    try:
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
        kinds: dict[str, str] = {}
        for form in FORMS:
            kinds |= _plant.plant_peer(dsn, form)
        world: dict[str, Any] = {"dsn": dsn, "kinds": kinds}
        world["refused"] = cli("repair", "--dsn", dsn, "--apply", "--idle", "0")
        with psycopg.connect(dsn) as conn:
            world["lz4"] = conn.execute(
                "SELECT current_setting('server_version_num')::int >= 140000 AND EXISTS ("
                "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' "
                "AND 'lz4' = ANY(enumvals))"
            ).fetchone()[0]  # type: ignore[index]
        assert cli("migrate", "--dsn", dsn, "--phase", "pre")[0] == 0
        for form in FORMS:
            kinds |= _plant.plant_ours(dsn, form)
        clean = sorted(t for t, k in kinds.items() if k in _plant.CLEAN)
        world["clean_before"] = rows_of(dsn, clean)
        code, out, _ = cli("audit", "--dsn", dsn, "--idle", "0", "--json")
        world["audit"] = (code, json.loads(out))
        code, out, _ = cli("repair", "--dsn", dsn, "--apply", "--idle", "0", "--json")
        world["repair"] = (code, json.loads(out))
        code, out, _ = cli("audit", "--dsn", dsn, "--idle", "0", "--json")
        world["again"] = (code, json.loads(out))
        world["clean_after"] = rows_of(dsn, clean)
        yield world
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def faults(report: dict[str, Any]) -> dict[str, set[str]]:
    return {
        t["thread_id"]: set(t["faults"]) for t in report["damaged_threads"] + report["risk_threads"]
    }


def test_repair_apply_before_migrate_says_what_migrate_changes(planted: dict[str, Any]) -> None:
    code, _, err = planted["refused"]
    assert code == 2 and "migrate --phase pre" in err and "Nothing was written" in err
    assert "adds only new tables" not in err  # the old, false claim
    assert "builds an index on checkpoints" in err
    assert ("lz4" in err) == planted["lz4"]  # only where the server can
    assert "task_path" not in err  # PostgresSaver v9 has it already


@pytest.mark.parametrize("form", FORMS)
def test_audit_finds_every_fault_planted_through_each_form(
    planted: dict[str, Any], form: str
) -> None:
    code, report = planted["audit"]
    assert code == 1
    found = faults(report)
    mine = {t: k for t, k in planted["kinds"].items() if t.startswith(f"{form}-")}
    assert {t: found.get(t, set()) for t in mine} == {t: EXPECTED[k] for t, k in mine.items()}
    classes = set().union(*(found[t] for t in mine))
    assert classes >= {
        "reapplied_input", "unfinished_step", "unanswered_tool_call", "forked_history",
        "unfinished_run",
    }  # fmt: skip


def test_repair_fixes_every_fault_and_a_second_audit_is_clean(planted: dict[str, Any]) -> None:
    code, done = planted["repair"]
    damaged = {t for t, k in planted["kinds"].items() if k in _plant.DAMAGED}
    assert code == 0, done
    assert {t["thread_id"] for t in done["threads"] if t["applied"]} == damaged
    assert not any(t["refused"] for t in done["threads"])
    for t in done["threads"]:
        if "reapplied_input" in t["faults"]:
            assert "remove 1 re-applied input message(s)" in t["actions"], t
    code, again = planted["again"]
    assert code == 0 and again["clean"], again["damaged_threads"]
    # what is left is the risk of PostgresSaver's heads without run id, nothing else (a
    # fork's repair only removes the losing branch: its head is PostgresSaver's still)
    assert faults(again) == {
        t: {"no_run_id"} for t, k in planted["kinds"].items() if k in {*_plant.CLEAN, "fork"}
    }


def test_clean_threads_are_unchanged_byte_for_byte(planted: dict[str, Any]) -> None:
    before, after = planted["clean_before"], planted["clean_after"]
    assert [len(t) for t in before] == [len(t) for t in after] and len(before[0]) > 0
    assert before == after


@pytest.mark.parametrize("form", FORMS)
def test_every_repaired_thread_takes_new_input(planted: dict[str, Any], form: str) -> None:
    dsn = planted["dsn"]
    make = _agent.FORMS[form]
    mine = {t: k for t, k in planted["kinds"].items() if k in _plant.DAMAGED and t.startswith(form)}
    with PostgresSaver.from_conn_string(dsn) as peer, DeterministicSaver(dsn) as ours:
        for tid, kind in sorted(mine.items()):
            saver = ours if kind == "run" else peer
            graph = _agent.build().compile(checkpointer=saver)
            cfg: Any = (
                run_config(tid, "after-repair")
                if kind == "run"
                else {"configurable": {"thread_id": tid}}
            )
            graph.invoke({"messages": make(f"and next, {tid}?")}, cfg)  # the strict model
            state = graph.get_state(cfg)
            assert not state.next, tid
            messages = state.values["messages"]
            texts = _agent.texts_of(messages)
            assert texts.count(_plant.question(tid)) == 1, (tid, texts)
            assert texts[-1] == f"and next, {tid}?"
            assert isinstance(messages[-1], AIMessage) and messages[-1].content.startswith("Answer")
            if kind in ("reapplied", "unfinished", "orphan", "run"):  # killed in the tool
                assert any(
                    isinstance(m, ToolMessage) and m.content == UNKNOWN_RESULT for m in messages
                ), tid


_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "lgd_chain", "lgd_runs",
           "lgd_leases", "lgd_queue", "lgd_journal", "lgd_journal_attempts", "lgd_repairs")  # fmt: skip


def test_deleting_a_repaired_thread_takes_its_backups_and_repair_log(planted: dict[str, Any]) -> None:
    """Runs after the tests that read the repaired threads: it deletes some of them."""
    dsn = planted["dsn"]
    with psycopg.connect(dsn) as conn:
        backups: dict[str, list[str]] = {}
        for thread, backup in conn.execute(
            "SELECT thread_id, backup_thread_id FROM lgd_repairs ORDER BY thread_id"
        ).fetchall():
            backups.setdefault(thread, []).append(backup)
    assert len(backups) >= 3, backups
    one, *several = sorted(backups)[:3]
    others = sorted(set(planted["kinds"]) - {one, *several})

    def left(threads: list[str]) -> dict[str, int]:
        with psycopg.connect(dsn) as conn:
            return {
                table: conn.execute(
                    f"SELECT count(*) FROM {table} WHERE thread_id = ANY(%s)", (threads,)
                ).fetchone()[0]  # type: ignore[index]
                for table in _TABLES
            }

    kept = left(others)
    with DeterministicSaver(dsn) as saver:
        saver.delete_thread(one)
        assert set(left([one, *backups[one]]).values()) == {0}
        saver.prune(several, strategy="delete")
        gone = [t for s in several for t in (s, *backups[s])]
        assert set(left(gone).values()) == {0}
    assert left(others) == kept  # no other thread's rows, its backups' included


# --- what repair cannot fix, it refuses: the audit keeps reporting it ------------------


class Log(TypedDict):
    log: Annotated[list[int], operator.add]


def _log_graph() -> StateGraph[Any]:
    def work(state: Log) -> Log:
        if _agent.KILL.is_set():
            raise _agent.WorkerKilled()
        return {"log": [len(state["log"])]}

    graph = StateGraph(Log)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_edge("work", END)
    return graph


def test_a_fault_repair_cannot_fix_is_refused_and_still_reported(pg_server_dsn: str) -> None:
    dsn = create_database(pg_server_dsn, prefix="lgd_refuse")
    try:
        with DeterministicSaver(dsn) as ours:
            ours.setup()
        with PostgresSaver.from_conn_string(dsn) as saver:
            graph = _log_graph().compile(checkpointer=saver)
            cfg: Any = {"configurable": {"thread_id": "log-1"}}
            _agent.KILL.set()
            with pytest.raises(_agent.WorkerKilled):
                graph.invoke({"log": [7]}, cfg, durability="sync")
            _agent.KILL.clear()
            graph.invoke({"log": [7]}, cfg, durability="sync")  # the retry: input again
        argv = ["--dsn", dsn, "--idle", "0", "--messages-channel", "log", "--json"]
        code, out, _ = cli("audit", *argv)
        assert code == 1 and faults(json.loads(out)) == {"log-1": {"reapplied_input", "no_run_id"}}
        code, out, _ = cli("repair", "--apply", *argv)
        (thread,) = json.loads(out)["threads"]
        assert code == 1 and not thread["applied"]
        assert "add_messages cannot read it as messages" in thread["refused"]
        code, out, _ = cli("audit", *argv)  # never "clean" for a thread left as it was
        assert code == 1 and faults(json.loads(out)) == {"log-1": {"reapplied_input", "no_run_id"}}
    finally:
        drop_database(pg_server_dsn, database_name(dsn))
