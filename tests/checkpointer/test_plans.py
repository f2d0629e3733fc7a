"""Query plans of the SQL our core really yields (captured from its generators, not
copied by hand): reads do work in proportion to their limit, not to the thread or the
table, and run-id lookups use their indexes. Structural checks on EXPLAIN ANALYZE
(rows read per node, index names, sort methods), no timing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic._db.batch import Batch, Operation
from langgraph_deterministic.checkpointer import _core, _reads
from langgraph_deterministic.checkpointer._rows import Codec

CODEC = Codec(JsonPlusSerializer())
LONG = "long"  # a thread of 3,000 root checkpoints (+ 300 in subgraph namespaces)


@pytest.fixture(scope="module")
def db(pg_server_dsn: str) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_plans")
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # 400 threads of 50 checkpoints plus the long one; each checkpoint references
        # two blobs (one its own) and has two pending writes; runs of 5 checkpoints.
        conn.execute(
            """
            INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
            SELECT t.id, ns, lpad(g::text, 8, '0'),
                   jsonb_build_object('v', 4, 'channel_values', '{}'::jsonb,
                       'channel_versions', jsonb_build_object('messages', 'v' || g, '__start__', 'v0')),
                   jsonb_build_object('source', CASE WHEN g %% 5 = 0 THEN 'input' ELSE 'loop' END,
                       'step', g, 'run_id', t.id || ':run-' || (g / 5))
            FROM (SELECT 'thread-' || i AS id, 50 AS n FROM generate_series(1, 400) i
                  UNION ALL SELECT %(long)s, 3300) t,
                 generate_series(1, t.n) g,
                 LATERAL (SELECT CASE WHEN g %% 11 = 0 THEN 'inner:' || g ELSE '' END AS ns) s
            """,
            {"long": LONG},
        )
        conn.execute(
            "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
            "SELECT thread_id, checkpoint_ns, v.key, v.value, 'msgpack', '\\x90'::bytea "
            "FROM checkpoints, jsonb_each_text(checkpoint -> 'channel_versions') v "
            "ON CONFLICT DO NOTHING"
        )
        conn.execute(
            "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
            "idx, channel, type, blob) SELECT thread_id, checkpoint_ns, checkpoint_id, 't', i, "
            "'messages', 'msgpack', '\\x90'::bytea FROM checkpoints, generate_series(0, 1) i"
        )
        conn.execute("INSERT INTO lgd_runs (thread_id, run_id, status, first_checkpoint_id, "
                     "last_checkpoint_id) SELECT DISTINCT thread_id, metadata ->> 'run_id', "
                     "'done', '', '' FROM checkpoints")  # fmt: skip
        conn.execute("VACUUM ANALYZE")
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def _first_batch(operation: Operation[Any]) -> Batch:
    return next(operation)


def _explain(dsn: str, batch: Batch, analyze: bool = True) -> dict[str, Any]:
    """EXPLAIN the batch's last statement after its others, in a transaction rolled back."""
    *before, statement = batch.statements
    opts = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with psycopg.connect(dsn) as conn:
        for st in before:
            conn.execute(st.sql, st.params)
        row = conn.execute(f"EXPLAIN ({opts}) {statement.sql}", statement.params).fetchone()
        conn.rollback()
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def _rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows all scans of ``relation`` returned, over all their loops."""
    return sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
        for n in _nodes(plan["Plan"])
        if n.get("Relation Name") == relation
    )


def _list(config: Any, filter: Any = None, limit: int | None = 10) -> Batch:
    return _first_batch(_reads.list_checkpoints(CODEC, config, filter, None, limit))


@pytest.mark.parametrize("limit", [10, 50])
def test_list_without_namespace_loads_blobs_and_writes_of_its_page_only(
    db: str, limit: int
) -> None:
    plan = _explain(db, _list({"configurable": {"thread_id": LONG}}, limit=limit))
    # Each returned checkpoint: 2 blobs, 2 writes. Before the fix the blob join hashed
    # every blob of the thread for each checkpoint, and ran for all 3,300 of them.
    assert _rows_read(plan, "checkpoint_blobs") == 2 * limit
    assert _rows_read(plan, "checkpoint_writes") == 2 * limit


def test_global_filtered_list_sorts_small_rows_in_memory(db: str) -> None:
    plan = _explain(db, _list(None, {"source": "loop"}))
    assert _rows_read(plan, "checkpoint_blobs") == 20
    assert _rows_read(plan, "checkpoint_writes") == 20
    sorts = [n for n in _nodes(plan["Plan"]) if n["Node Type"] == "Sort"]
    assert sorts and all(n["Sort Method"] == "top-N heapsort" for n in sorts), sorts
    assert plan["Plan"].get("Temp Written Blocks", 0) == 0


def test_get_tuple_reads_one_checkpoints_blobs_on_a_long_thread(db: str) -> None:
    config = {"configurable": {"thread_id": LONG, "checkpoint_ns": ""}}
    plan = _explain(db, _first_batch(_reads.get_tuple(CODEC, config)))
    assert _rows_read(plan, "checkpoint_blobs") == 2


def test_run_id_filters_use_the_run_id_index(db: str) -> None:
    plan = _explain(db, _list(None, {"run_id": "thread-7:run-3"}, limit=None), analyze=False)
    used = {n.get("Index Name") for n in _nodes(plan["Plan"])}
    assert "checkpoints_run_id_idx" in used, plan


def test_delete_for_runs_is_key_lookups_without_jit(db: str) -> None:
    batch = _first_batch(_core.delete_for_runs(["thread-5:run-2", "thread-9:run-4"]))
    plan = _explain(db, batch)
    nodes = list(_nodes(plan["Plan"]))
    assert {n.get("Index Name") for n in nodes} >= {"checkpoints_run_id_idx", "lgd_runs_run_id_idx"}
    scanned = {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}
    # empty here: a seq scan of nothing (the journal's tables have run_id indexes too)
    assert scanned <= {"lgd_chain", "lgd_journal", "lgd_journal_attempts"}, scanned
    # The batch turns JIT off for its transaction, whatever the plan's estimated cost.
    with psycopg.connect(db) as conn:
        for st in batch.statements[:-1]:
            conn.execute(st.sql, st.params)
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("off",)
        conn.rollback()
    assert "JIT" not in plan
    # 10 checkpoints deleted, each with 2 writes and 1 own blob; nothing else touched.
    assert _rows_read(plan, "checkpoint_writes") == 20


def test_delete_for_runs_keeps_blobs_other_checkpoints_still_reference(db: str) -> None:
    def blobs() -> set[tuple[str, str]]:
        with psycopg.connect(db) as conn:
            rows = conn.execute(
                "SELECT channel, version FROM checkpoint_blobs WHERE thread_id = 'thread-3'"
            ).fetchall()
        return {(r[0], r[1]) for r in rows}

    before = blobs()
    with DeterministicSaver(db) as saver:
        saver.delete_for_runs(["thread-3:run-2"])  # checkpoints 10-14 of the thread
        listed = saver.list({"configurable": {"thread_id": "thread-3"}})
        left = [t.config["configurable"]["checkpoint_id"] for t in listed]
    # Their own messages blobs went with them; the __start__ blob every checkpoint of the
    # thread shares stayed.
    assert before - blobs() == {("messages", f"v{g}") for g in range(10, 15)}
    assert ("__start__", "v0") in blobs()
    assert len(left) == 45 and not {f"{g:08d}" for g in range(10, 15)} & set(left)


def _sent_by_list(db: str, monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> Any:
    """The statements ``saver.list(...)`` really sends (recorded at the sync driver), and
    what it returned."""
    from langgraph_deterministic.checkpointer import saver as saver_module

    sent: list[Batch] = []
    execute = saver_module.execute

    def recording(conn: Any, batch: Batch) -> Any:
        sent.append(batch)
        return execute(conn, batch)

    monkeypatch.setattr(saver_module, "execute", recording)
    with DeterministicSaver(db) as saver:
        listed = list(saver.list(*args, **kwargs))
    monkeypatch.undo()
    return sent, listed


@pytest.mark.parametrize(
    "config", [None, {"configurable": {"thread_id": "thread-7"}}], ids=["global", "thread"]
)
def test_the_run_id_filter_list_sends_uses_the_run_id_index(
    db: str, monkeypatch: pytest.MonkeyPatch, config: Any
) -> None:
    """EXPLAIN of the very statement list(filter={"run_id": ...}) sent, not a copy."""
    sent, listed = _sent_by_list(db, monkeypatch, config, filter={"run_id": "thread-7:run-3"})
    assert len(listed) == 5 and {t.metadata["run_id"] for t in listed} == {"thread-7:run-3"}
    (batch,) = sent  # format v4 rows: no pending-sends read
    plan = _explain(db, batch)
    nodes = list(_nodes(plan["Plan"]))
    assert "checkpoints_run_id_idx" in {n.get("Index Name") for n in nodes}, plan
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plan
    assert _rows_read(plan, "checkpoints") == 5  # the run's checkpoints, nothing else
