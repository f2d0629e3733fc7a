"""The sans-I/O core, driven by an in-memory stand-in for Postgres (fake_db.py): what each
operation sends, in which batches, and what it makes of the rows and errors it gets back.
The same generators run under the sync and async drivers against a real server in the
rest of the suite; here the database's answers are canned, so every branch is reachable."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.serde.types import TASKS
from langgraph.types import Send

from langgraph_deterministic import run_config
from langgraph_deterministic._compat.langgraph import INTERRUPT, NULL_TASK_ID
from langgraph_deterministic._db import batch as _batch
from langgraph_deterministic.checkpointer import _admission, _core, _reads, _rows, _statements
from langgraph_deterministic.checkpointer._keys import (
    ATTEMPT_KEY,
    FINGERPRINT_KEY,
    GRAPH_RUN_MARKER,
)
from langgraph_deterministic.checkpointer._ledger import Admission, HeldLease
from langgraph_deterministic.checkpointer.contract import RunContract
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    PruneRefusedError,
    RunInputMismatchError,
    RunSupersededError,
    RunUnfinishedError,
    ThreadBusyError,
)

from .fake_db import CODEC, FakeDb, PgError, checkpoint_row, sends_row

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
V1, V2, V3 = (f"{i:032}.{0.5:016}" for i in (1, 2, 3))


def graph_config(
    thread: str = "t1",
    run: str = "r1",
    *,
    strategy: Any = None,
    fingerprint: str | None = "input:aaaa",
    checkpoint_id: str | None = None,
    attempt: str | None = None,
    ns: str = "",
) -> Any:
    """The config a running graph passes its saver for a run_config(...) call."""
    config = run_config(thread, run, multitask_strategy=strategy)
    configurable = config["configurable"]
    configurable[GRAPH_RUN_MARKER] = object()
    configurable["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    if attempt is not None:
        configurable[ATTEMPT_KEY] = attempt
    config["callbacks"][0].fingerprint = fingerprint
    return config


def admit_row(
    verdict: str, *, ticket: int | None = None, holder: str | None = "r0"
) -> tuple[Any, ...]:
    """An ``lgd_admit_v3`` row: (verdict, ticket, holder run, attempt, expires, ended,
    strategy, outcome, acquired, this run's outcome)."""
    if holder is None:
        return (verdict, ticket, None, None, None, None, None, None, None, "free")
    return (verdict, ticket, holder, "att-0", NOW, None, "reject", "free", NOW, None)


NEW_THREAD = [(None,) * 18]  # select_head_with_run on a thread without checkpoints


def head_with_run(row: tuple[Any, ...], ledger: tuple[Any, Any, Any] = (None, None, None)) -> Any:
    return [(*row, *ledger)]


# --- reads ----------------------------------------------------------------------------


def test_get_tuple_is_one_read_and_maps_blobs_inline_values_and_sorted_writes() -> None:
    row = checkpoint_row(
        "c2",
        parent="c1",
        values={"count": 3},
        versions={"count": V1, "messages": V2, "gone": V1},
        metadata={"step": 1, "run_id": "r1"},
        blobs=[("messages", ["hi", "there"])],
        writes=[
            ("task-b", "messages", "second", "~__pregel_pull, b", 0),
            ("task-a", "messages", "first", "~__pregel_pull, a", 1),
            ("task-a", "messages", "zeroth", "~__pregel_pull, a", 0),
        ],
    )
    # an "empty" blob (a channel emptied at that version) is not a value
    row = (*row[:6], [*row[6], "gone"], [*row[7], "empty"], [*row[8], b""], *row[9:])
    db = FakeDb().on("select_checkpoint", [row])
    found = db.run(_reads.get_tuple(CODEC, {"configurable": {"thread_id": "t1"}}))
    assert db.names() == [["select_checkpoint"]]
    (statement,) = db.batches[0].statements
    assert statement.params == {"thread_id": "t1", "checkpoint_ns": ""}
    assert statement.sql.endswith("ORDER BY c.checkpoint_id DESC LIMIT 1")
    assert not db.batches[0].atomic
    assert found is not None
    assert found.checkpoint["channel_values"] == {"count": 3, "messages": ["hi", "there"]}
    assert found.config == {
        "configurable": {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c2"}
    }
    assert found.parent_config is not None
    assert found.parent_config["configurable"]["checkpoint_id"] == "c1"
    # LangGraph's order: by task path, then task id, then index
    assert [w[2] for w in found.pending_writes or ()] == ["zeroth", "first", "second"]


def test_get_tuple_addressed_reads_that_checkpoint_and_none_when_missing() -> None:
    db = FakeDb()
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": "sub:1", "checkpoint_id": "c9"}}
    assert db.run(_reads.get_tuple(CODEC, config)) is None
    (statement,) = db.batches[0].statements
    assert statement.params == {"thread_id": "t1", "checkpoint_ns": "sub:1", "checkpoint_id": "c9"}
    assert "c.checkpoint_id = %(checkpoint_id)s" in statement.sql


def test_get_tuple_without_thread_id_refuses_before_any_batch() -> None:
    db = FakeDb()
    with pytest.raises(ConfigurationError, match=r"configurable\.thread_id"):
        db.run(_reads.get_tuple(CODEC, {"configurable": {}}))
    assert db.batches == []


# --- checkpoints older than format v4: pending sends -----------------------------------


def test_v3_checkpoint_gets_its_parents_pending_sends_in_the_tasks_channel() -> None:
    sends = [Send("work", {"part": 0}), Send("work", {"part": 1})]
    row = checkpoint_row("c2", parent="c1", v=3, versions={"a": V1, "b": V3, "c": V2})
    db = FakeDb().on("select_checkpoint", [row]).on("pending_sends", [sends_row("c1", sends)])
    found = db.run(_reads.get_tuple(CODEC, {"configurable": {"thread_id": "t1"}}))
    assert db.names() == [["select_checkpoint"], ["pending_sends"]]
    (asked,) = db.sent("pending_sends")
    assert asked.params == {"thread_ids": ["t1"], "checkpoint_ns": [""], "checkpoint_ids": ["c1"]}
    assert found is not None
    assert found.checkpoint["channel_values"][TASKS] == sends
    # the version LangGraph expects: the checkpoint's greatest, as the peer sets it
    assert found.checkpoint["channel_versions"][TASKS] == V3


def test_v3_checkpoint_without_versions_gets_a_first_version_for_its_sends() -> None:
    row = checkpoint_row("c2", parent="c1", v=2)
    db = (
        FakeDb()
        .on("select_checkpoint", [row])
        .on("pending_sends", [sends_row("c1", [Send("n", 1)])])
    )
    found = db.run(_reads.get_tuple(CODEC, {"configurable": {"thread_id": "t1"}}))
    assert found is not None
    assert found.checkpoint["channel_versions"][TASKS].startswith(f"{1:032}.")


@pytest.mark.parametrize(
    "row",
    [
        checkpoint_row("c2", parent="c1", v=4),  # v4 keeps sends in TASKS itself
        checkpoint_row("c1", parent=None, v=3),  # a first checkpoint has no parent
    ],
    ids=["v4", "v3-without-parent"],
)
def test_no_pending_sends_read_when_there_can_be_none(row: tuple[Any, ...]) -> None:
    db = FakeDb().on("select_checkpoint", [row])
    found = db.run(_reads.get_tuple(CODEC, {"configurable": {"thread_id": "t1"}}))
    assert db.names() == [["select_checkpoint"]]
    assert found is not None and TASKS not in found.checkpoint["channel_values"]


def test_list_folds_sends_of_every_old_checkpoint_with_one_read() -> None:
    rows = [
        checkpoint_row("c4", parent="c3", v=4),
        checkpoint_row("c3", parent="c2", v=3, versions={"a": V1}),
        checkpoint_row("c2", parent="c1", v=3, versions={"a": V1}),
    ]
    db = (
        FakeDb()
        .on("list", rows)
        .on("pending_sends", [sends_row("c2", [Send("x", 2)]), sends_row("c1", [Send("x", 1)])])
    )
    listed = db.run(
        _reads.list_checkpoints(CODEC, {"configurable": {"thread_id": "t1"}}, None, None, None)
    )
    assert db.names() == [["list"], ["pending_sends"]]
    assert db.sent("pending_sends")[0].params["checkpoint_ids"] == ["c2", "c1"]  # the parents
    assert [t.checkpoint["channel_values"].get(TASKS) for t in listed] == [
        None, [Send("x", 2)], [Send("x", 1)],
    ]  # fmt: skip


def test_a_global_list_folds_each_threads_own_sends() -> None:
    """Two threads with the same parent id (copy_thread keeps ids): each checkpoint gets
    its own thread's sends (the query used to read the first row's thread only)."""
    rows = [
        checkpoint_row("c2", thread_id="ta", parent="c1", v=3, versions={"a": V1}),
        checkpoint_row("c2", thread_id="tb", parent="c1", v=3, versions={"a": V1}),
    ]
    db = (
        FakeDb()
        .on("list", rows)
        .on(
            "pending_sends",
            [
                sends_row("c1", [Send("x", "a")], thread_id="ta"),
                sends_row("c1", [Send("x", "b")], thread_id="tb"),
            ],
        )
    )
    listed = db.run(_reads.list_checkpoints(CODEC, None, None, None, None))
    (asked,) = db.sent("pending_sends")
    assert asked.params == {
        "thread_ids": ["ta", "tb"], "checkpoint_ns": ["", ""], "checkpoint_ids": ["c1", "c1"],
    }  # fmt: skip
    assert [t.checkpoint["channel_values"][TASKS] for t in listed] == [
        [Send("x", "a")],
        [Send("x", "b")],
    ]


# --- list: the statement it builds --------------------------------------------------------


def test_list_statement_filters_by_run_id_through_its_index_and_keeps_containment() -> None:
    before = {"configurable": {"thread_id": "t1", "checkpoint_id": "c5"}}
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    batch = next(_reads.list_checkpoints(CODEC, config, {"run_id": "r1", "step": 2}, before, 3))
    (statement,) = batch.statements
    # One fixed statement: a NULL parameter drops its condition. Unprepared, so Postgres
    # plans it with the values and folds the dropped ones away (test_plans.py EXPLAINs it).
    assert "(c.metadata ->> 'run_id') = %(run_id)s::text" in statement.sql
    assert "c.metadata @> %(filter)s::jsonb" in statement.sql
    assert "c.checkpoint_id < %(before)s::text" in statement.sql
    assert statement.sql.count("LIMIT %(limit)s") == 1
    assert not statement.prepare
    params = dict(statement.params or {})
    assert params.pop("filter").obj == {"run_id": "r1", "step": 2}  # Jsonb
    assert params == {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": None,
                      "run_id": "r1", "before": "c5", "limit": 3}  # fmt: skip


def test_list_without_run_id_filter_or_limit() -> None:
    batch = next(_reads.list_checkpoints(CODEC, None, {"source": "loop"}, None, None))
    (statement,) = batch.statements
    params = dict(statement.params or {})
    assert params.pop("filter").obj == {"source": "loop"}
    assert set(params.values()) == {None}  # no run id condition, no limit


# --- put ------------------------------------------------------------------------------


def _checkpoint(values: dict[str, Any], checkpoint_id: str = "c2") -> Any:
    return {
        "v": 4, "id": checkpoint_id, "ts": "2026-12-01T00:00:00+00:00",
        "channel_values": values, "channel_versions": {}, "versions_seen": {},
    }  # fmt: skip


def test_put_without_contract_keeps_primitives_inline_and_blobs_only_new_versions() -> None:
    db = FakeDb()
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    values = {"n": 1, "s": "x", "none": None, "messages": ["a"], "old": {"k": 1}}
    out = db.run(
        _core.put(CODEC, config, _checkpoint(values), {"step": 1}, {"messages": V2, "n": V2})
    )
    assert out["configurable"] == {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c2"}
    # blobs and checkpoint in one statement: they land together or not at all
    assert db.names() == [["put_with"]]
    (upsert,) = db.sent("put_with")
    assert "INSERT INTO checkpoints" in upsert.sql and upsert.sql.count("::bytea") == 1
    row = upsert.params or {}
    assert (row["channel_0"], row["version_0"]) == ("messages", V2)
    assert [row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")] == ["t1", "", "c2"]
    assert row["parent_checkpoint_id"] == "c1"
    stored = row["checkpoint"]
    assert stored.obj["channel_values"] == {"n": 1, "s": "x", "none": None}


def test_a_puts_blobs_beyond_rows_max_go_in_statements_of_their_own() -> None:
    """At most ROWS_MAX rows per statement (a few fixed shapes get prepared): the first
    blobs in insert_blobs statements, the last ones with the checkpoint."""
    n = _statements.ROWS_MAX + 3
    values = {f"ch{i}": [i] for i in range(n)}
    config = graph_config(checkpoint_id="c1", attempt="att-1")
    db = FakeDb()
    db.run(
        _core.put(CODEC, config, _checkpoint(values), {}, dict.fromkeys(values, V2), RunContract())
    )
    assert db.names() == [["insert_blobs", "put_with"]]
    first, last = db.batches[0].statements
    assert first.sql.count("::bytea") == _statements.ROWS_MAX and last.sql.count("::bytea") == 3
    assert "lgd_put_checkpoint_v6" in last.sql
    sent = [p[f"channel_{i}"] for p in (first.params, last.params) for i in range(n) if f"channel_{i}" in p]  # type: ignore[operator,index]
    assert sent == list(values)


def test_writes_riding_with_their_put_leave_the_lease_check_to_it() -> None:
    """Pending writes sent before their checkpoint's child, in its transaction, skip their
    own lease probe (the put's lgd_put_checkpoint_v6 checks the same lease later in the
    same transaction); the chain fence stays. Sent alone, they keep both."""
    config = graph_config(checkpoint_id="c1", attempt="att-1")
    contract = RunContract()
    pending = []
    for writes, task in (([("a", 1), ("b", 2)], "task-1"), ([("__error__", "boom")], "task-2")):
        op = _core.put_writes(CODEC, config, writes, task, "p", contract)
        pending.extend(next(op).statements)
    alone = FakeDb()
    alone.run(_core.put_writes(CODEC, config, [("a", 1)], "task-1", "p", contract))
    assert alone.names() == [["guarded_writes"]]
    assert "lgd_leases" in alone.batches[0].statements[0].sql
    db = FakeDb()
    db.run(_core.put(CODEC, config, _checkpoint({}), {}, {}, contract, pending=pending))
    assert db.names() == [["riding_writes", "riding_write", "guarded_put_checkpoint"]]
    riders = db.batches[0].statements[:2]
    assert all("lgd_leases" not in st.sql and "lgd_fence_writes_v7" in st.sql for st in riders)
    assert [st.params for st in riders] == [st.params for st in pending]


def test_regular_writes_go_in_one_fenced_statement_special_ones_one_per_row() -> None:
    config = graph_config(checkpoint_id="c1", attempt="att-1")
    db = FakeDb()
    writes = [(f"ch{i}", i) for i in range(_statements.ROWS_MAX + 1)]
    db.run(_core.put_writes(CODEC, config, writes, "task-1", "p", RunContract()))
    db.run(_core.put_writes(CODEC, config, [("__error__", "boom")], "task-1", "p", RunContract()))
    assert db.names() == [["guarded_writes", "guarded_writes"], ["guarded_write"]]
    chunk, rest = db.batches[0].statements
    params = chunk.params or {}
    assert (params["slot"], params["attempt"], params["run_id"]) == ("c1", "att-1", "r1")
    assert [params[f"idx_{i}"] for i in range(_statements.ROWS_MAX)] == list(range(_statements.ROWS_MAX))
    assert (rest.params or {})["idx_0"] == _statements.ROWS_MAX
    (special,) = db.sent("guarded_write")
    assert special.many and [r["replace"] for r in special.params or ()] == [True]


def test_put_under_the_contract_is_one_guarded_statement_and_maps_refusals() -> None:
    config = graph_config(checkpoint_id="c1", attempt="att-1")
    contract = RunContract("require")
    db = FakeDb()
    db.run(_core.put(CODEC, config, _checkpoint({}), {"source": "loop"}, {}, contract))
    (guarded,) = db.sent("guarded_put_checkpoint")
    params = guarded.params or {}
    assert [params[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")] == ["t1", "", "c2"]
    assert params["parent_checkpoint_id"] == "c1"
    # run id, attempt, a root write with run id (ledger)
    assert (params["run_id"], params["attempt"], params["ledger"]) == ("r1", "att-1", True)
    for state, error in [
        ("LG409", ConcurrentRunError),
        ("LG411", ConfigurationError),
        ("LG412", RunSupersededError),
        ("LG413", ConcurrentRunError),
    ]:
        refused = FakeDb().on("guarded_put_checkpoint", PgError(state, "detail here"))
        with pytest.raises(error, match=r"detail here|Command") as caught:
            refused.run(_core.put(CODEC, config, _checkpoint({}), {}, {}, contract))
        assert caught.value.__cause__ is None  # ours, not chained to the driver's error
        assert refused.names() == [["guarded_put_checkpoint"]]  # nothing more was sent
    other = FakeDb().on("guarded_put_checkpoint", PgError("23505", "dup"))
    with pytest.raises(PgError):
        other.run(_core.put(CODEC, config, _checkpoint({}), {}, {}, contract))


def test_put_refuses_ids_too_long_to_index_before_sending_anything() -> None:
    db = FakeDb()
    config = {"configurable": {"thread_id": "t" * 1500, "checkpoint_ns": "n" * 600}}
    with pytest.raises(ConfigurationError, match="too long to index"):
        db.run(_core.put(CODEC, config, _checkpoint({}), {}, {}))
    assert db.batches == []


# --- put_writes: the LG412 / refused-attempt chain ---------------------------------------


def test_duplicate_command_is_refused_and_its_attempt_barred_from_the_checkpoint() -> None:
    """LG412 from lgd_guard_writes: LangGraph has applied the Command in memory already,
    so the core bars the attempt (refuse_attempt: the child slot 'refused:<attempt>')
    before raising, in a batch of its own after the refused one rolled back."""
    config = graph_config(checkpoint_id="c1", attempt="att-2")
    db = FakeDb().on("guard_writes", PgError("LG412", "checkpoint c1 was written by run r1 itself"))
    with pytest.raises(RunSupersededError, match="duplicate delivery"):
        db.run(
            _core.put_writes(
                CODEC, config, [("__resume__", "yes")], NULL_TASK_ID, "", RunContract()
            )
        )
    assert db.names() == [["guard_writes", "guarded_write"], ["refuse_attempt"]]
    assert all(b.atomic for b in db.batches)
    (guard,) = db.sent("guard_writes")
    (refuse,) = db.sent("refuse_attempt")
    assert refuse.params == guard.params
    assert guard.params == {
        "thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c1", "slot": "c1",
        "attempt": "att-2", "run_id": "r1", "command": True, "interrupted": False,
    }  # fmt: skip
    # the fenced write rows carry the slot and attempt the SQL checks
    (rows,) = db.sent("guarded_write")
    (row,) = rows.params or ()
    assert [row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id",
                             "task_path", "idx", "channel")] == [
        "t1", "", "c1", NULL_TASK_ID, "", WRITES_IDX_MAP["__resume__"], "__resume__"
    ]  # fmt: skip
    assert (row["slot"], row["attempt"], row["run_id"], row["replace"]) == ("c1", "att-2", "r1", True)


def test_a_refused_attempts_later_writes_are_refused_again() -> None:
    """Its next pending writes hit the 'refused:' slot (lgd_fence_writes_v7 raises LG412):
    refused the same way; barring again is a no-op (ON CONFLICT DO NOTHING)."""
    config = graph_config(checkpoint_id="c1", attempt="att-2")
    db = FakeDb().on(
        "guarded_writes", PgError("LG412", "this attempt was refused at checkpoint c1")
    )
    with pytest.raises(RunSupersededError):
        db.run(_core.put_writes(CODEC, config, [("messages", "x")], "task-1", "p", RunContract()))
    assert db.names() == [["guarded_writes"], ["refuse_attempt"]]


@pytest.mark.parametrize(
    ("state", "attempt", "error", "after"),
    [
        ("LG412", None, RunSupersededError, []),  # no attempt to bar (not a graph run's write)
        ("LG410", "att-2", ConcurrentRunError, []),  # a zombie: nothing to bar
        ("LG413", "att-2", ConcurrentRunError, []),
    ],
)
def test_other_refusals_send_nothing_more(
    state: str, attempt: str | None, error: type[Exception], after: list[list[str]]
) -> None:
    config = graph_config(checkpoint_id="c1", attempt=attempt)
    db = FakeDb().on("guard_writes", PgError(state, "d")).on("guarded_write", PgError(state, "d"))
    with pytest.raises(error):
        db.run(
            _core.put_writes(CODEC, config, [("__resume__", 1)], NULL_TASK_ID, "", RunContract())
        )
    assert db.names()[1:] == after


def test_put_writes_without_contract_uses_the_plain_statements() -> None:
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    db = FakeDb()
    db.run(_core.put_writes(CODEC, config, [("a", 1), ("b", 2)], "task", "p"))
    db.run(_core.put_writes(CODEC, config, [("__error__", "boom")], "task", "p"))
    db.run(_core.put_writes(CODEC, config, [], "task", "p"))  # nothing to write: no batch
    assert db.names() == [["insert_writes"], ["upsert_write"]]
    (regular,) = db.sent("insert_writes")
    assert [(regular.params or {})[f"idx_{i}"] for i in (0, 1)] == [0, 1]


# --- a graph run loading its thread: admission and start checks ---------------------------


def test_first_run_on_a_new_thread_is_admitted_in_one_round_trip() -> None:
    config = graph_config()
    db = (
        FakeDb()
        .on("admit", [admit_row("admitted", holder=None)])
        .on("select_head_with_run", NEW_THREAD)
    )
    assert db.run(_reads.get_tuple(CODEC, config, RunContract())) is None
    assert db.names() == [["admit", "select_head_with_run"]]
    (admit,) = db.sent("admit")
    assert admit.params is not None and admit.params["strategy"] == "reject"
    held = config["callbacks"][0].held
    assert held == HeldLease("t1", "r1", admit.params["attempt"], started_empty=True)


def test_a_run_that_found_its_thread_empty_closes_no_run_with_its_writes() -> None:
    """Its writes continue only its own checkpoints: lgd_put_checkpoint_v6 is not asked to
    read a parent's run id to close it (closes None). A run that loaded another run's
    checkpoint, and then does not know its parent's run, still is."""
    for head, closes in ((NEW_THREAD, None), (head_with_run(checkpoint_row("c0")), "superseded")):
        config = graph_config()
        db = FakeDb().on("admit", [admit_row("admitted", holder=None)])
        db.on("select_head_with_run", head).run(_reads.get_tuple(CODEC, config, RunContract()))
        config["configurable"]["checkpoint_id"] = "c1"  # a write after its first one
        db = FakeDb()
        db.run(_core.put(CODEC, config, _checkpoint({}), {"source": "loop"}, {}, RunContract()))
        (put,) = db.sent("guarded_put_checkpoint")
        assert put.params is not None and put.params["closes"] == closes


def test_an_attempt_s_ledger_row_is_written_by_its_first_committed_write_only() -> None:
    """The first root write of an admitted attempt brings its ledger row up to date; its
    later writes skip the ledger (ledger False: no read of the row, no parent's run id).
    A write that failed made nothing current; a write with another attempt token, and a
    new attempt (a retry with the same config), write the row again."""
    config = graph_config()

    def admit() -> None:
        config["configurable"].pop("checkpoint_id", None)  # the thread's head
        db = FakeDb().on("admit", [admit_row("admitted", holder=None)])
        db.on("select_head_with_run", head_with_run(checkpoint_row("c0")))
        db.run(_reads.get_tuple(CODEC, config, RunContract()))

    def put(cid: str, parent: str, db: FakeDb | None = None) -> Any:
        db = db or FakeDb()
        config["configurable"]["checkpoint_id"] = parent
        db.run(_core.put(CODEC, config, _checkpoint({}, cid), {"source": "loop"}, {},
                         RunContract()))  # fmt: skip
        (sent,) = db.sent("guarded_put_checkpoint")
        assert sent.params is not None
        return sent.params["ledger"], sent.params["closes"]

    admit()
    failing = FakeDb().on("guarded_put_checkpoint", psycopg.OperationalError("gone"))
    with pytest.raises(psycopg.OperationalError):
        put("c1", "c0", failing)
    assert put("c1", "c0") == (True, "superseded")  # the retried write: the row's first
    assert put("c2", "c1") == (False, None)
    assert put("c3", "c2") == (False, None)
    # A write carrying another attempt token is not this attempt's: the full ledger path.
    config["configurable"][ATTEMPT_KEY] = "another-attempt"
    assert put("c4", "c3") == (True, "superseded")
    del config["configurable"][ATTEMPT_KEY]
    admit()  # a new attempt
    assert put("c1", "c0") == (True, "superseded")
    assert put("c2", "c1") == (False, None)


def test_admitted_run_gets_its_attempt_token_in_the_loaded_config() -> None:
    row = checkpoint_row("c1", metadata={"run_id": "r0", FINGERPRINT_KEY: "input:zz"})
    db = (
        FakeDb()
        .on("admit", [admit_row("admitted", holder=None)])
        .on("select_head_with_run", head_with_run(row))
    )
    found = db.run(_reads.get_tuple(CODEC, graph_config(attempt="runner-att"), RunContract()))
    assert found is not None
    assert found.config["configurable"][ATTEMPT_KEY] == "runner-att"  # the runner's own
    assert db.sent("admit")[0].params["attempt"] == "runner-att"  # type: ignore[index]


def test_busy_thread_is_refused_without_touching_the_lease() -> None:
    db = FakeDb().on("admit", [admit_row("busy")]).on("select_head_with_run", NEW_THREAD)
    with pytest.raises(ThreadBusyError, match="'r0' is running"):
        db.run(_reads.get_tuple(CODEC, graph_config(), RunContract()))
    assert db.names() == [["admit", "select_head_with_run"]]


def test_a_refused_start_gives_the_admitted_lease_back() -> None:
    """Admitted, then the start checks refuse (same run id, another input): the lease is
    handed back (lgd_unadmit_v4 with the holder it replaced) before the error."""
    row = checkpoint_row("c1", metadata={"run_id": "r1", FINGERPRINT_KEY: "input:original"})
    db = (
        FakeDb()
        .on("admit", [admit_row("admitted", holder="r0")])
        .on("select_head_with_run", head_with_run(row))
    )
    with pytest.raises(RunInputMismatchError):
        db.run(_reads.get_tuple(CODEC, graph_config(fingerprint="input:changed"), RunContract()))
    assert db.names() == [["admit", "select_head_with_run"], ["unadmit"]]
    (unadmit,) = db.sent("unadmit")
    assert unadmit.params is not None
    assert (unadmit.params["run_id"], unadmit.params["holder_attempt"]) == ("r0", "att-0")
    assert unadmit.params["attempt"] == db.sent("admit")[0].params["attempt"]  # type: ignore[index]


def test_a_journaled_run_is_admitted_by_lgd_journal_admit_v1_in_the_same_round_trip() -> None:
    """A graph run of the attempt a PostgresJournal session runs: lgd_journal_admit_v1 in
    place of lgd_admit_v3, same parameters, same pipeline; its fence check comes back on
    the held lease. Another attempt's run (a graph nested in a node, say) is admitted by
    lgd_admit_v3 and carries no fence check."""
    fence = NOW
    for attempt, journal, query in (
        ("runner-att", "runner-att", "journal_admit"),
        ("runner-att", "other-att", "admit"),
    ):
        config = graph_config(attempt=attempt)
        db = (
            FakeDb()
            .on(query, [(*admit_row("admitted", holder=None), fence)])
            .on("select_head_with_run", NEW_THREAD)
        )
        assert db.run(_reads.get_tuple(CODEC, config, RunContract(), journal)) is None
        assert db.names() == [[query, "select_head_with_run"]]
        held = config["callbacks"][0].held
        expected = fence if query == "journal_admit" else None
        assert held == HeldLease("t1", "r1", attempt, expected, started_empty=True)


def test_a_refused_journaled_start_undoes_the_registration_with_the_lease() -> None:
    row = checkpoint_row("c1", metadata={"run_id": "r1", FINGERPRINT_KEY: "input:original"})
    db = (
        FakeDb()
        .on("journal_admit", [(*admit_row("admitted", holder="r0"), NOW)])
        .on("select_head_with_run", head_with_run(row))
    )
    config = graph_config(fingerprint="input:changed", attempt="runner-att")
    with pytest.raises(RunInputMismatchError):
        db.run(_reads.get_tuple(CODEC, config, RunContract(), "runner-att"))
    assert db.names() == [["journal_admit", "select_head_with_run"], ["unadmit", "journal_unadmit"]]
    (undo,) = db.sent("journal_unadmit")
    assert undo.params == {"thread_id": "t1", "attempt": "runner-att"}


def test_enqueued_run_waits_and_is_admitted_with_its_ticket() -> None:
    """The wait is a batch of its own, without a statement: the saver gives its pooled
    connection back for it (_waiting) and wakes it by the ticket."""
    db = (
        FakeDb()
        .on("admit", [admit_row("queued", ticket=7)], [admit_row("admitted", ticket=7)])
        .on("select_head_with_run", NEW_THREAD)
    )
    contract = RunContract(lease_ttl=2.0)
    assert db.run(_reads.get_tuple(CODEC, graph_config(strategy="enqueue"), contract)) is None
    assert db.names() == [
        ["admit", "select_head_with_run"], ["wait"], ["admit", "select_head_with_run"],
    ]  # fmt: skip
    channel = _admission.queue_channel("t1")
    assert db.batches[1].wait == (channel, 0.5)  # a quarter of the lease TTL
    assert db.batches[1].ticket == 7
    assert [s.params["ticket"] for s in db.sent("admit")] == [None, 7]  # type: ignore[index]


def test_enqueued_run_leaves_the_queue_when_its_timeout_is_spent() -> None:
    db = (
        FakeDb().on("admit", [admit_row("queued", ticket=3)]).on("select_head_with_run", NEW_THREAD)
    )
    with pytest.raises(ThreadBusyError, match=r"waited 0\.0 s in the queue"):
        db.run(
            _reads.get_tuple(CODEC, graph_config(strategy="enqueue"), RunContract(enqueue_timeout=0))
        )
    assert db.names() == [["admit", "select_head_with_run"], ["leave_queue"]]
    assert db.sent("leave_queue")[0].params == {"thread_id": "t1", "ticket": 3}


@pytest.mark.parametrize("strategy", ["reject", "enqueue"])
def test_unfinished_previous_run_is_refused(strategy: str) -> None:
    db = FakeDb().on("admit", [admit_row("unfinished")]).on("select_head_with_run", NEW_THREAD)
    with pytest.raises(RunUnfinishedError, match="'r0'") as refused:
        db.run(_reads.get_tuple(CODEC, graph_config(strategy=strategy), RunContract()))
    # One more read, on the refusal only: how the unfinished run was started.
    assert db.names() == [["admit", "select_head_with_run"], ["run_journaled"]]
    assert db.sent("run_journaled")[0].params["run_id"] == "r0"
    assert refused.value.unfinished_run_id == "r0" and not refused.value.journaled
    assert "graph.invoke(None, run_config('t1', 'r0'))" in str(refused.value)


def test_an_unfinished_journaled_run_names_the_runner_as_its_fix() -> None:
    db = (
        FakeDb().on("admit", [admit_row("unfinished")]).on("select_head_with_run", NEW_THREAD)
        .on("run_journaled", [(1,)])
    )  # fmt: skip
    with pytest.raises(RunUnfinishedError) as refused:
        db.run(_reads.get_tuple(CODEC, graph_config(), RunContract()))
    assert refused.value.journaled
    assert (
        "DeterministicRunner(journal=PostgresJournal(saver)).invoke(graph, None, "
        "run_config('t1', 'r0'))" in str(refused.value)
    )


def test_late_retry_of_a_finished_run_loads_its_final_checkpoint() -> None:
    head = checkpoint_row("c9", metadata={"run_id": "r2"})
    final = checkpoint_row("c5", metadata={"run_id": "r1"}, values={"answer": 42})
    db = (
        FakeDb()
        .on("admit", [admit_row("admitted", holder=None)])
        .on("select_head_with_run", head_with_run(head, ("done", "c5", "input:aaaa")))
        .on("select_checkpoint", [final])
    )
    found = db.run(_reads.get_tuple(CODEC, graph_config(), RunContract()))
    assert found is not None and found.checkpoint["channel_values"] == {"answer": 42}
    assert db.names() == [["admit", "select_head_with_run"], ["select_checkpoint"]]
    assert db.sent("select_checkpoint")[0].params == {
        "thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c5"
    }  # fmt: skip


def test_run_without_recorder_takes_no_lease() -> None:
    config = graph_config()
    config["callbacks"] = []
    db = FakeDb().on("select_head_with_run", NEW_THREAD)
    with pytest.raises(Exception, match="not made by run_config"):
        db.run(_reads.get_tuple(CODEC, config, RunContract()))
    assert db.names() == [["select_head_with_run"]]  # no admit: the saver would never release


# --- put_batch: a run's writes at most once ---------------------------------------------------


def _batch_items(parent: str | None = "c1") -> list[tuple[Any, ...]]:
    config = graph_config(checkpoint_id=parent, attempt="att-1")
    return [
        ("writes", config, [("messages", "m")], "task-1", "p"),
        ("put", config, _checkpoint({}, "c2"), {"source": "loop"}, {}),
    ]


def test_put_batch_writes_everything_in_one_transaction_with_the_release() -> None:
    held = HeldLease("t1", "r1", "att-1")
    db = FakeDb()
    assert db.run(_core.put_batch(CODEC, _batch_items(), RunContract(), (held, "ok"))) is None
    assert db.names() == [
        ["child_of_run"],
        ["guarded_writes", "guarded_put_checkpoint", "release_lease"],
    ]
    assert db.batches[1].atomic
    assert db.sent("child_of_run")[0].params == {"thread_id": "t1", "parent": "c1", "run_id": "r1"}


def test_put_batch_that_already_committed_writes_nothing_and_returns_the_child() -> None:
    db = FakeDb().on("child_of_run", [("c2",)])
    assert db.run(_core.put_batch(CODEC, _batch_items(), RunContract())) == "c2"
    assert db.names() == [["child_of_run"]]


def test_put_batch_losing_a_race_to_its_own_commit_returns_the_winners_child() -> None:
    db = (
        FakeDb()
        .on("child_of_run", [], [("c2-winner",)])
        .on("guarded_put_checkpoint", PgError("LG409", "taken"))
    )
    assert db.run(_core.put_batch(CODEC, _batch_items(), RunContract())) == "c2-winner"
    assert db.names()[-1] == ["child_of_run"]


def test_put_batch_refused_releases_the_lease_as_failed_and_raises_ours() -> None:
    held = HeldLease("t1", "r1", "att-1")
    db = FakeDb().on("guarded_put_checkpoint", PgError("LG413", "taken over"))
    with pytest.raises(ConcurrentRunError, match="taken over"):
        db.run(_core.put_batch(CODEC, _batch_items(), RunContract(), (held, "ok")))
    assert db.names()[-1] == ["release_lease"]
    assert db.sent("release_lease")[-1].params == {
        "thread_id": "t1",
        "run_id": "r1",
        "attempt": "att-1",
        "ended": "error",
    }


def test_a_release_alone_does_not_wait_for_the_flush() -> None:
    held = HeldLease("t1", "r1", "att-1")
    db = FakeDb()
    db.run(_admission.release_lease(held, "ok", lazy=True))
    db.run(_admission.release_lease(held, "error"))
    assert db.names() == [["release_lease_lazy"], ["release_lease"]]
    assert "set_config('synchronous_commit', 'off', true)" in db.batches[0].statements[0].sql


def test_the_release_of_a_call_that_stored_an_interrupt_marks_its_run_first() -> None:
    """The interrupt's write of an admitted attempt is noted on its recorder; the release
    (once, and only for that attempt's lease) sends mark_interrupted before itself, in its
    transaction, which then waits for the WAL flush like any state change."""
    config = graph_config()
    db = FakeDb().on("admit", [admit_row("admitted", holder=None)])
    db.on("select_head_with_run", head_with_run(checkpoint_row("c0")))
    db.run(_reads.get_tuple(CODEC, config, RunContract()))
    recorder = config["callbacks"][0]
    held = recorder.held
    config["configurable"]["checkpoint_id"] = "c1"
    db = FakeDb()
    db.run(_core.put_writes(CODEC, config, [(INTERRUPT, "q")], "task-1", "", RunContract()))
    assert db.names() == [["guard_writes", "guarded_write"]]
    assert recorder.interrupted_at == (held, "c1")
    at = recorder.take_interrupt(held)
    assert at == "c1" and recorder.take_interrupt(held) is None  # once
    recorder.interrupted_at = (held, "c1")
    assert recorder.take_interrupt(HeldLease("t1", "r1", held.attempt)) is None  # not its lease
    db = FakeDb()
    db.run(_admission.release_lease(held, "ok", lazy=True, interrupted_at=at))
    assert db.names() == [["mark_interrupted", "release_lease"]]  # durable: not lazy
    assert db.sent("mark_interrupted")[0].params == {
        "thread_id": "t1", "run_id": "r1", "attempt": held.attempt, "checkpoint_id": "c1"
    }  # fmt: skip


# --- prune, delta history, versions -------------------------------------------------------


def test_prune_arguments_and_delta_refusals() -> None:
    db = FakeDb()
    with pytest.raises(TypeError, match=r"prune\(\[thread_id\]\)"):
        db.run(_core.prune("t1", "delete"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Unknown prune strategy"):
        db.run(_core.prune(["t1"], "all"))
    db.run(_core.prune([], "keep_latest"))
    assert db.batches == []
    db.run(_core.prune(["t1", "t2"], "delete"))
    assert db.names() == [["delete_threads"]]

    refused = FakeDb().on("delta_threads", [("t2",)])
    with pytest.raises(PruneRefusedError, match=r"t2\. .*Nothing was pruned"):
        refused.run(_core.prune(["t1", "t2"], "keep_latest"))
    assert refused.names() == [["delta_threads"]]

    turned = FakeDb().on("prune_keep_latest", [(False,)], [(True,)])
    with pytest.raises(PruneRefusedError, match="threads pruned before it: t1"):
        turned.run(_core.prune(["t1", "t2"], "keep_latest"))
    assert [b.isolation for b in turned.batches[1:]] == ["repeatable read"] * 2


def test_delta_history_orders_writes_oldest_checkpoint_first() -> None:
    def w(cid: str, depth: int, value: str, path: str, idx: int = 0) -> tuple[Any, ...]:
        return ("w", cid, depth, "log", *CODEC.dumps("w", value), "task", path, idx, None)

    rows = [
        w("c3", 1, "newest", "a"),
        w("c2", 2, "older-b", "b"),
        w("c2", 2, "older-a", "a"),
        ("s", "c1", 3, "log", None, None, None, None, None, ["seed"]),
    ]
    db = FakeDb().on("delta_history", rows)
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c4"}}
    history = db.run(_reads.delta_history(CODEC, config, ["log", "other"]))
    assert [x[2] for x in history["log"]["writes"]] == ["older-a", "older-b", "newest"]
    assert history["log"]["seed"] == ["seed"]
    assert history["other"] == {"writes": []}


def test_next_version_is_the_peers_format_and_increments() -> None:
    first = _rows.next_version(None)
    counter, tiebreak = first.split(".", 1)
    assert counter == f"{1:032}" and 0 <= float(tiebreak) < 1
    assert _rows.next_version(first).startswith(f"{2:032}.")
    assert _rows.next_version(5).startswith(f"{6:032}.")


# --- the drivers' contract -----------------------------------------------------------------


def test_a_failed_batch_is_thrown_into_the_operation_so_it_can_clean_up() -> None:
    seen: list[str] = []

    def operation() -> _batch.Operation[str]:
        try:
            yield _batch.Batch.read("SELECT 1")
        except KeyboardInterrupt:
            yield _batch.Batch.write(_batch.Statement("SELECT 2"))
            seen.append("cleaned up")
            raise
        return "unreachable"

    def execute(batch: _batch.Batch) -> _batch.Results:
        if batch.statements[0].sql == "SELECT 1":
            raise KeyboardInterrupt
        seen.append("cleanup sent")
        return [None]

    with pytest.raises(KeyboardInterrupt):
        _batch.run(operation(), execute)
    assert seen == ["cleanup sent", "cleaned up"]


async def test_arun_drives_the_same_operation_as_run() -> None:
    row = checkpoint_row("c1", values={"n": 1})

    async def execute(batch: _batch.Batch) -> _batch.Results:
        return FakeDb().on("select_checkpoint", [row]).execute(batch)

    found = await _batch.arun(
        _reads.get_tuple(CODEC, {"configurable": {"thread_id": "t1"}}), execute
    )
    assert found is not None and found.checkpoint["channel_values"] == {"n": 1}


# --- the end of an attempt that stored nothing -------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "stored", "ended", "sent"),
    [
        ("free", False, "error", "abandon_lease"),  # refused input, a cancel before a write
        ("retry", False, "error", "abandon_lease"),
        ("enqueued", False, "error", "abandon_lease"),
        ("free", True, "error", "release_lease_lazy"),  # it wrote: the run is unfinished
        ("free", False, "ok", "release_lease_lazy"),
        ("interrupted r0", False, "error", "release_lease_lazy"),  # it changed r0 too
        ("finished", False, "error", "release_lease_lazy"),  # took no lease: a no-op
    ],
)
def test_an_attempt_that_stored_nothing_undoes_its_admission(
    outcome: str, stored: bool, ended: str, sent: str
) -> None:
    admission = Admission.from_row((*admit_row("admitted")[:9], outcome))
    held = HeldLease("t1", "r1", "att-1", admission=admission)
    db = FakeDb()
    db.run(_admission.release_lease(held, ended, lazy=True, stored=stored))
    assert db.names() == [[sent]]
    (st,) = db.sent(sent)
    assert st.params is not None and st.params["thread_id"] == "t1"
    if sent == "abandon_lease":  # the lease as it was before: r0's
        assert st.params["run_id"] == "r0" and st.params["holder_attempt"] == "att-0"
        assert st.params["attempt"] == "att-1"
    else:
        assert st.params["run_id"] == "r1" and st.params["ended"] == ended
