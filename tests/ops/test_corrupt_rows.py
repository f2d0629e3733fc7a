"""Corrupt rows are contained: reads of such a thread raise our error naming the thread
and checkpoint, the threads beside it keep working, ``audit`` lists it as ``unreadable``
and finishes the scan (the real damage beside it still found, exit codes meaningful) and
``repair`` refuses it with the reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import CorruptCheckpointError, DeterministicSaver, run_config
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops.audit import audit
from langgraph_deterministic.ops.repair import repair

# How each kind of damage is done by hand (a restore gone wrong, a bad migration, a
# hand edit); %s is the thread id.
CORRUPTIONS = {
    "checkpoint_is_a_string": "UPDATE checkpoints SET checkpoint = '\"garbage\"' WHERE thread_id = %s",
    "metadata_is_a_list": "UPDATE checkpoints SET metadata = '[1]' WHERE thread_id = %s",
    "versions_are_a_string": "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, "
    "'{channel_versions}', '\"x\"') WHERE thread_id = %s",
    "truncated_blob": "UPDATE checkpoint_blobs SET blob = substring(blob for length(blob) - 9) "
    "WHERE thread_id = %s AND channel = 'messages'",
    "unknown_blob_kind": "UPDATE checkpoint_blobs SET type = 'nonsense' "
    "WHERE thread_id = %s AND channel = 'messages'",
}  # fmt: skip


class Boom(Exception):
    pass


@pytest.fixture(scope="module")
def corrupt_db(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_corrupt")
    try:
        with DeterministicSaver(dsn) as saver:
            saver.setup()
            graph = _graph(saver)
            for tid in [*CORRUPTIONS, "clean"]:
                graph.invoke({"messages": [("user", "hi")]}, run_config(tid, f"{tid}-1"))
            with pytest.raises(Boom):  # the real damage: a step left, nobody retries
                graph.invoke({"messages": [("user", "boom")]}, run_config("stuck", "stuck-1"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            for tid, sql in CORRUPTIONS.items():
                assert conn.execute(sql, (tid,)).rowcount >= 1, tid
        yield dsn
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def _graph(saver: DeterministicSaver) -> Any:
    def agent(state: MessagesState) -> dict[str, Any]:
        if state["messages"][-1].content == "boom":
            raise Boom
        call = {"name": "lookup", "args": {}, "id": "call-1", "type": "tool_call"}
        return {
            "messages": [
                AIMessage("", tool_calls=[call]),
                ToolMessage("found", tool_call_id="call-1"),
                AIMessage("done"),
            ]
        }

    builder = StateGraph(MessagesState).add_node(agent).add_edge(START, "agent")
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
async def test_reads_name_the_thread_and_the_others_keep_working(corrupt_db: str, kind: str) -> None:
    with DeterministicSaver(corrupt_db) as saver:
        graph = _graph(saver)
        config = run_config(kind, f"{kind}-2")
        for read in (
            lambda: saver.get_tuple(config),
            lambda: list(saver.list(config)),
            lambda: graph.get_state(config),
            lambda: graph.invoke({"messages": [("user", "again")]}, config),
        ):
            with pytest.raises(CorruptCheckpointError, match=f"Thread '{kind}'.*checkpoint '"):
                read()
        state = graph.invoke({"messages": [("user", "more")]}, run_config("clean", f"clean-{kind}"))
        assert state["messages"][-1].content == "done"
    async with DeterministicSaver(corrupt_db) as asaver:
        with pytest.raises(CorruptCheckpointError, match="audit"):
            await asaver.aget_tuple(run_config(kind, f"{kind}-3"))


def test_audit_lists_them_finishes_the_scan_and_still_finds_the_real_damage(
    corrupt_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = audit(corrupt_db, idle=timedelta(0))
    faults = {t: {f.fault for f in fs} for t, fs in report.by_thread().items()}
    for kind in CORRUPTIONS:
        assert faults.get(kind) == {"unreadable"}, (kind, faults.get(kind))
    assert "unfinished_step" in faults["stuck"] and "unreadable" not in faults["stuck"]
    assert "clean" not in faults
    assert report.threads == len(CORRUPTIONS) + 2  # every thread scanned

    code = main(["audit", "--dsn", corrupt_db, "--idle", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1  # damage found (not 2: the audit itself did not fail)
    assert sorted(out["unreadable_threads"]) == sorted(CORRUPTIONS)
    assert out["counts"]["unreadable"] == len(CORRUPTIONS)
    assert "stuck" in {t["thread_id"] for t in out["damaged_threads"]}
    assert main(["audit", "--dsn", corrupt_db, "--idle", "0"]) == 1
    assert "unreadable" in capsys.readouterr().out


def test_repair_refuses_them_with_the_reason_and_still_repairs_the_rest(corrupt_db: str) -> None:
    plan = repair(corrupt_db, idle=timedelta(0))
    by_thread = {t.thread_id: t for t in plan.threads}
    for kind in CORRUPTIONS:
        assert by_thread[kind].refused and "cannot be read" in by_thread[kind].refused, kind
    assert by_thread["stuck"].refused is None and by_thread["stuck"].actions
    assert plan.exit_code == 1


def test_an_audit_that_fails_exits_2_not_1(
    corrupt_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["audit", "--dsn", "postgresql://nobody@127.0.0.1:1/x"]) == 2
    assert "error:" in capsys.readouterr().err

    def crash(*args: Any, **kwargs: Any) -> None:  # a bug of ours, not one of our errors
        raise RuntimeError("boom")

    monkeypatch.setattr("langgraph_deterministic.ops.audit._Scanner.analyse", crash)
    for argv in (["audit"], ["audit", "--json"], ["repair"]):
        assert main([*argv, "--dsn", corrupt_db]) == 2, argv
        err = capsys.readouterr().err
        assert "itself failed (RuntimeError: boom)" in err and "Traceback" not in err


def test_the_fix_the_errors_name_works_delete_thread_clears_them(corrupt_db: str) -> None:
    """Runs last in this module: it removes the corrupt threads the tests above read."""
    with DeterministicSaver(corrupt_db) as saver:
        for kind in CORRUPTIONS:
            saver.delete_thread(kind)
            assert saver.get_tuple(run_config(kind, "after")) is None
    faults = {t: {f.fault for f in fs} for t, fs in audit(corrupt_db).by_thread().items()}
    assert not any("unreadable" in f for f in faults.values()), faults


def test_a_run_with_corrupt_channel_versions_can_still_be_rolled_back(pg_server_dsn: str) -> None:
    """lgd_rollback_run_v3 (multitask rollback, a takeover of a dead run) read every deleted
    checkpoint's channel_versions with jsonb_each_text, which raises on a non-object: the
    thread could never take its next run (migration 0027 guards it)."""
    dsn = create_database(pg_server_dsn, prefix="lgd_corrupt_rb")
    try:
        with DeterministicSaver(dsn) as saver:
            saver.setup()
            _graph(saver).invoke({"messages": [("user", "hi")]}, run_config("rb", "rb-1"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute(CORRUPTIONS["versions_are_a_string"], ("rb",)).rowcount >= 1
            (deleted,) = conn.execute("SELECT lgd_rollback_run_v3('rb', 'rb-1', 'rb-2')").fetchone()  # type: ignore[misc]
            assert deleted >= 1
            left = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = 'rb'").fetchone()
            status = conn.execute("SELECT status FROM lgd_runs WHERE run_id = 'rb-1'").fetchone()
        assert left == (0,) and status == ("rolled_back",)
    finally:
        drop_database(pg_server_dsn, database_name(dsn))
