"""Bad input gets a clear error from our hierarchy, names the fix, and writes nothing."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_deterministic import (
    ConfigurationError,
    DatabaseAccessError,
    DatabaseUnavailableError,
    DeterministicError,
    DeterministicSaver,
    SchemaNotReadyError,
    SerializationError,
    is_retryable,
)
from langgraph_deterministic.checkpointer import PruneRefusedError


def _counts(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM checkpoints), (SELECT count(*) FROM checkpoint_blobs),"
            " (SELECT count(*) FROM checkpoint_writes)"
        ).fetchone()
    assert row is not None
    return row


@pytest.fixture(scope="module")
def ready(dsn: str) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


def test_invalid_dsn_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="libpq URI") as caught:
        DeterministicSaver("host=localhost this is not a dsn")
    # one sentence: the driver's message ends in a line break, which is not kept
    assert "\n" not in str(caught.value)
    assert 'connection info string. Pass a libpq URI' in str(caught.value)


def test_unreachable_server_names_the_fix() -> None:
    # Port 1 on loopback: nothing listens there, the refusal is immediate.
    with pytest.raises(DatabaseUnavailableError, match="Check that the server is running"):  # noqa: SIM117
        with DeterministicSaver("postgresql://nobody@127.0.0.1:1/nothing"):
            pass


async def test_unreachable_server_async() -> None:
    with pytest.raises(DatabaseUnavailableError, match="DSN"):
        async with DeterministicSaver("postgresql://nobody@127.0.0.1:1/nothing"):
            pass


def test_wrong_password_or_database_is_reported_as_such(pg_server_dsn: str) -> None:
    conninfo = psycopg.conninfo.conninfo_to_dict(pg_server_dsn)
    conninfo["dbname"] = "no_such_database_here"
    with pytest.raises(DatabaseAccessError, match="no_such_database_here") as caught:  # noqa: SIM117
        with DeterministicSaver(psycopg.conninfo.make_conninfo(**conninfo)):
            pass
    assert not is_retryable(caught.value)  # a retry loop would spin on it forever


def test_missing_tables_say_run_setup(pg_server_dsn: str) -> None:
    from tests.conftest import make_database

    from devtools.postgres import database_name, drop_database

    empty = make_database(pg_server_dsn, prefix="lgd_nosetup")
    try:
        with DeterministicSaver(empty, run_id_policy="off") as saver:
            config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            with pytest.raises(SchemaNotReadyError, match=r"setup\(\)"):
                saver.get_tuple(config)
            with pytest.raises(SchemaNotReadyError, match="migrate"):
                saver.put(config, empty_checkpoint(), {}, {})
    finally:
        drop_database(pg_server_dsn, database_name(empty))


class _S(TypedDict):
    n: int


@pytest.mark.parametrize("tables", ["none", "the peer's"])
def test_a_graph_run_before_setup_says_run_setup_and_writes_nothing(
    pg_server_dsn: str, tables: str
) -> None:
    """The most common first mistake, and the adoption case: a database with no tables,
    or only langgraph-checkpoint-postgres's. The run's admission calls one of our
    functions first: its absence is a SchemaNotReadyError too, not psycopg's
    UndefinedFunction."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from tests.conftest import make_database

    from devtools.postgres import database_name, drop_database
    from langgraph_deterministic import run_config

    db = make_database(pg_server_dsn, prefix="lgd_nosetup_run")
    try:
        if tables != "none":
            with PostgresSaver.from_conn_string(db) as peer:
                peer.setup()
        graph = StateGraph(_S)
        graph.add_node("inc", lambda s: {"n": s["n"] + 1})
        graph.add_edge(START, "inc")
        with DeterministicSaver(db) as saver:
            compiled = graph.compile(checkpointer=saver)
            with pytest.raises(SchemaNotReadyError, match=r"setup\(\).*migrate --phase pre"):
                compiled.invoke({"n": 0}, run_config("t", "r1"))
        if tables != "none":
            assert _counts(db) == (0, 0, 0)
    finally:
        drop_database(pg_server_dsn, database_name(db))


def test_a_database_migrated_part_way_says_migrate_and_the_retry_continues(
    pg_server_dsn: str,
) -> None:
    """A rolling deploy's new worker on a database without the latest pre-migration
    (0023's lgd_fence_writes_v7 missing): the run's admission and first checkpoint commit,
    then its first pending writes fail. The error names the migration; after it, the
    retry with the same run id continues the run and applies its input once."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, MessagesState
    from tests.conftest import make_database

    from devtools.postgres import database_name, drop_database
    from langgraph_deterministic import run_config
    from langgraph_deterministic._db.migrate import VERSION_TABLE

    db = make_database(pg_server_dsn, prefix="lgd_partway")
    try:
        with DeterministicSaver(db) as saver:
            saver.setup()
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("DROP FUNCTION lgd_fence_writes_v7")
            conn.execute(f"DELETE FROM {VERSION_TABLE} WHERE version = 23")
        graph = StateGraph(MessagesState)
        graph.add_node("a", lambda s: {"messages": [("ai", "a")]})
        graph.add_node("b", lambda s: {"messages": [("ai", "b")]})
        graph.add_edge(START, "a")
        graph.add_edge("a", "b")
        graph.add_edge("b", END)
        given = {"messages": [HumanMessage("hi")]}
        with DeterministicSaver(db) as saver:
            compiled = graph.compile(checkpointer=saver)
            with pytest.raises(SchemaNotReadyError, match=r"migrate --phase pre.*same run id"):
                compiled.invoke(given, run_config("t", "r1"))
            saver.setup()  # the pre-migration, late
            out = compiled.invoke(given, run_config("t", "r1"))
        assert [m.content for m in out["messages"]] == ["hi", "a", "b"]
    finally:
        drop_database(pg_server_dsn, database_name(db))


def test_connection_without_autocommit_is_refused(ready: str) -> None:
    with psycopg.connect(ready) as conn, pytest.raises(ConfigurationError, match="autocommit=True"):
        DeterministicSaver(conn)


def test_wrong_types_and_options(ready: str) -> None:
    with pytest.raises(ConfigurationError, match="DSN string"):
        DeterministicSaver(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'require', 'warn' or 'off'"):
        DeterministicSaver(ready, run_id_policy="sometimes")  # type: ignore[arg-type]
    with DeterministicSaver(ready, run_id_policy="off") as saver:
        with pytest.raises(ConfigurationError, match="thread_id"):
            saver.get_tuple({"configurable": {}})
        with pytest.raises(ConfigurationError, match="keep_latest"):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(ConfigurationError, match=r"prune\(\[thread_id\]\)"):
            saver.prune("t")
        with pytest.raises(ConfigurationError, match="new target"):
            saver.copy_thread("t", "t")


class Unserialisable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_unserialisable_channel_value_writes_nothing(ready: str) -> None:
    before = _counts(ready)
    with DeterministicSaver(ready, run_id_policy="off") as saver:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"ok": ["fine"], "bad": Unserialisable()}
        checkpoint["channel_versions"] = {"ok": "1", "bad": "1"}
        config: RunnableConfig = {"configurable": {"thread_id": "ser", "checkpoint_ns": ""}}
        with pytest.raises(SerializationError, match=r"channel 'bad'.*serde") as info:
            saver.put(config, checkpoint, {}, {"ok": "1", "bad": "1"})
        assert isinstance(info.value, DeterministicError)
        config["configurable"]["checkpoint_id"] = checkpoint["id"]
        with pytest.raises(SerializationError, match="write to channel 'x'"):
            saver.put_writes(config, [("y", 1), ("x", Unserialisable())], "task-1")
    assert _counts(ready) == before


async def test_unserialisable_state_in_a_graph_leaves_the_thread_as_it_was(ready: str) -> None:
    class S(TypedDict, total=False):
        value: Any
        n: int

    def good(state: S) -> dict[str, Any]:
        return {"n": 1}

    def bad(state: S) -> dict[str, Any]:
        return {"value": Unserialisable()}

    graph = StateGraph(S)
    graph.add_node("good", good)
    graph.add_node("bad", bad)
    graph.add_edge(START, "good")
    graph.add_edge("good", "bad")
    async with DeterministicSaver(ready, run_id_policy="off") as saver:
        app = graph.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": "graph-ser"}}
        with pytest.raises(SerializationError):
            await app.ainvoke({"n": 0}, config, durability="sync")
        history = [s async for s in app.aget_state_history(config)]
        # The steps before the bad one are intact; the bad value was never stored.
        assert history and all("value" not in s.values for s in history)
        assert history[0].values["n"] == 1


def test_prune_refuses_delta_threads_and_prunes_nothing(ready: str) -> None:
    with DeterministicSaver(ready, run_id_policy="off") as saver:
        config: RunnableConfig = {"configurable": {"thread_id": "delta", "checkpoint_ns": ""}}
        for step in range(3):
            cp = empty_checkpoint()
            config = saver.put(config, cp, {"step": step, "counters_since_delta_snapshot": {}}, {})  # type: ignore[typeddict-unknown-key]
        plain: RunnableConfig = {"configurable": {"thread_id": "plain", "checkpoint_ns": ""}}
        for step in range(3):
            plain = saver.put(plain, empty_checkpoint(), {"step": step}, {})
        with pytest.raises(PruneRefusedError, match="delete") as info:
            saver.prune(["plain", "delta"])
        assert isinstance(info.value, NotImplementedError)  # what the base API documents
        assert len(list(saver.list({"configurable": {"thread_id": "plain"}}))) == 3
        saver.prune(["plain"])
        assert len(list(saver.list({"configurable": {"thread_id": "plain"}}))) == 1


def test_a_write_batch_is_atomic_when_its_last_statement_fails(ready: str) -> None:
    """Blobs go first in a put; if the checkpoint row is then refused, no blob remains.
    (Postgres cannot store a NUL character in JSONB, so an inline string holding one
    makes the last statement of the batch fail.)"""
    before = _counts(ready)
    with DeterministicSaver(ready, run_id_policy="off") as saver:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"big": ["goes to a blob"], "text": "nul\x00here"}
        checkpoint["channel_versions"] = {"big": "1", "text": "1"}
        config: RunnableConfig = {"configurable": {"thread_id": "atomic", "checkpoint_ns": ""}}
        with pytest.raises(Exception, match=r"\\u0000|NUL"):
            saver.put(config, checkpoint, {}, {"big": "1", "text": "1"})
        # The connection is usable afterwards and nothing of the batch was stored.
        assert saver.get_tuple(config) is None
    assert _counts(ready) == before


def test_only_connection_failures_read_as_an_unreachable_server() -> None:
    """A deadlock or serialization failure is an OperationalError too, but calling it
    'cannot reach Postgres' would send the operator the wrong way and hide that the
    operation may simply be retried."""
    from langgraph_deterministic._db.translate import translate_error

    for transient in (
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.SerializationFailure("could not serialize access"),
    ):
        assert translate_error(transient) is transient
    refused = psycopg.OperationalError("connection refused")
    assert isinstance(translate_error(refused), DatabaseUnavailableError)
