"""audit and repair, through the CLI (``cli.main``), on small databases with planted
faults (benchmarks/fault_db.py, LangGraph's own layout) and on a thread a real SIGKILL
and retry damaged (the demo's workers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from benchmarks import fault_db
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.postgres import PostgresSaver

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.cli import main
from langgraph_deterministic.demos import support_agent as demo
from langgraph_deterministic.ops.repair import UNKNOWN_RESULT


@pytest.fixture()
def fresh_db(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_ops")
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def found_faults(report: dict[str, Any]) -> dict[str, set[str]]:
    return {
        t["thread_id"]: set(t["faults"])
        for t in report["damaged_threads"] + report["risk_threads"]
    }


@pytest.mark.parametrize("ledger", [True, False], ids=["with-lgd-tables", "postgres-saver-only"])
def test_audit_finds_every_planted_fault_and_nothing_else(
    fresh_db: str, ledger: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = fault_db.build(fresh_db, threads=120, planted=2, runs=3, ledger=ledger)
    code, report = run_json(capsys, "audit", "--dsn", fresh_db)
    assert code == 1
    assert report["threads_scanned"] == 120
    assert found_faults(report) == {t: set(e) for t, e in expected.items() if e}
    # the negative controls are there, and clean
    kinds = dict(fault_db.plan(120, 2))
    assert {"interrupted", "active", "repeat_user"} <= set(kinds.values())
    assert report["active_threads"] == 2
    # --thread and --since narrow the scan
    one = next(t for t, e in expected.items() if "forked_history" in e)
    code, report = run_json(capsys, "audit", "--dsn", fresh_db, "--thread", one)
    assert (code, found_faults(report)) == (1, {one: {"forked_history"}})
    code, report = run_json(capsys, "audit", "--dsn", fresh_db, "--since", "1h")
    assert code == 0 and report["threads_scanned"] == 2  # only the two 'active' threads


def test_audit_exit_codes_and_table_output(
    fresh_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--dsn", fresh_db]) == 2  # no checkpoint tables yet
    assert "no checkpoint tables" in capsys.readouterr().err
    assert main(["audit", "--dsn", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    assert main(["audit", "--dsn", fresh_db, "--since", "yesterday"]) == 2  # usage
    fault_db.build(fresh_db, threads=20, planted=0, runs=2)
    capsys.readouterr()
    assert main(["audit", "--dsn", fresh_db, "--pause", "0.01", "--statement-timeout", "2000"]) == 0
    out = capsys.readouterr().out
    assert "scanned 20 threads" in out and "no damage found" in out


def continue_thread(dsn: str, thread_id: str) -> list[Any]:
    """One more user turn with the demo's agent, whose model answers HTTP 400 to a history
    with an unanswered tool call, as providers do."""
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = demo.build("repair-test").compile(checkpointer=saver)
        config = {"configurable": {"thread_id": thread_id}}
        out = graph.invoke({"messages": [HumanMessage("and order A-1002?")]}, config)
        assert not graph.get_state(config).next
        return list(out["messages"])


def test_repair_leaves_every_planted_fault_usable_and_audit_clean(
    fresh_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = fault_db.build(fresh_db, threads=60, planted=2, runs=3)
    damaged = {t for t, e in expected.items() if e - {"no_run_id"}}
    # the damage is real: the provider-like model refuses an orphaned thread as it is
    monkeypatch.setenv("LGD_DEMO_DSN", fresh_db)
    demo._side_effects_table(fresh_db)
    orphan = next(t for t, e in expected.items() if e == {"unanswered_tool_call"})
    with DeterministicSaver(fresh_db, run_id_policy="off") as saver:
        saver.copy_thread(orphan, "probe")
        with pytest.raises(demo.ProviderError, match="400"):
            continue_thread(fresh_db, "probe")
        saver.delete_thread("probe")

    code, plan = run_json(capsys, "repair", "--dsn", fresh_db)
    assert code == 1 and not any(t["applied"] for t in plan["threads"])
    assert {t["thread_id"] for t in plan["threads"]} == damaged
    code, report = run_json(capsys, "audit", "--dsn", fresh_db)
    assert set(found_faults(report)) >= damaged  # the dry run wrote nothing

    code, done = run_json(capsys, "repair", "--dsn", fresh_db, "--apply")
    assert code == 0, done
    assert {t["thread_id"] for t in done["threads"] if t["applied"]} == damaged
    code, report = run_json(capsys, "audit", "--dsn", fresh_db)
    assert code == 0, report["damaged_threads"]
    assert set(found_faults(report)) == {t for t, e in expected.items() if e == {"no_run_id"}}

    for thread_id in sorted(damaged):
        messages = continue_thread(fresh_db, thread_id)
        assert messages[-1].content == "Done: refunded A-1001"
        if expected[thread_id] & {"unanswered_tool_call", "unfinished_step"}:
            assert any(
                isinstance(m, ToolMessage) and m.content == UNKNOWN_RESULT for m in messages
            )
        if "reapplied_input" in expected[thread_id]:  # the retry's copy is gone
            humans = [m.content for m in messages if isinstance(m, HumanMessage)]
            assert humans.count("Please refund order A-1001") == 3
    code, report = run_json(capsys, "audit", "--dsn", fresh_db)
    assert code == 0

    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute("SELECT thread_id, faults, backup_thread_id FROM lgd_repairs").fetchall()
        assert {r[0] for r in rows} == damaged
        for thread_id, _, backup in rows:  # the copy holds what the repair replaced
            (n,) = conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (backup,)
            ).fetchone()  # type: ignore[misc]
            assert n > 0, thread_id
        # a second repair finds nothing to do
    assert main(["repair", "--dsn", fresh_db, "--apply"]) == 0


def test_repair_apply_needs_our_repair_log(fresh_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    fault_db.build(fresh_db, threads=20, planted=1, runs=2, ledger=False)
    assert main(["repair", "--dsn", fresh_db, "--apply"]) == 2
    assert "migrate --phase pre" in capsys.readouterr().err
    assert main(["repair", "--dsn", fresh_db]) == 1  # the dry run needs nothing of ours


def test_audit_and_repair_a_thread_a_real_sigkill_and_retry_broke(
    fresh_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    demo._side_effects_table(fresh_db)
    with PostgresSaver.from_conn_string(fresh_db) as saver:
        saver.setup()
    assert demo.attempt("postgres-saver", fresh_db, crash=True)[0] == -9
    code, report = run_json(capsys, "audit", "--dsn", fresh_db, "--idle", "0")
    assert found_faults(report) == {"ticket-42-postgres-saver": {"unfinished_step", "no_run_id"}}
    assert demo.attempt("postgres-saver", fresh_db, crash=False)[0] == 1  # the queue's retry: 400
    code, report = run_json(capsys, "audit", "--dsn", fresh_db, "--idle", "0")
    assert code == 1
    assert found_faults(report) == {
        "ticket-42-postgres-saver": {
            "reapplied_input", "unanswered_tool_call", "unfinished_step", "no_run_id"
        }
    }
    with DeterministicSaver(fresh_db) as ours:
        ours.setup()
    # written a moment ago: a run may be in progress, so repair refuses it...
    code, done = run_json(capsys, "repair", "--dsn", fresh_db, "--apply")
    assert code == 1 and "in progress" in done["threads"][0]["refused"]
    # ...until the thread has been idle long enough (here: told it has)
    code, done = run_json(capsys, "repair", "--dsn", fresh_db, "--apply", "--idle", "0")
    assert code == 0, done
    monkeypatch.setenv("LGD_DEMO_DSN", fresh_db)
    messages = continue_thread(fresh_db, "ticket-42-postgres-saver")
    humans = [m.content for m in messages if isinstance(m, HumanMessage)]
    assert humans == ["Please refund order A-1001", "and order A-1002?"]
    code, report = run_json(capsys, "audit", "--dsn", fresh_db, "--idle", "0")
    assert code == 0
