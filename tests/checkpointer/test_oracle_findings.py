"""Bugs found by running LangGraph's own test suite against DeterministicSaver
(``scripts/langgraph_suite.sh``), each pinned here against a real Postgres, with the peer
(langgraph's PostgresSaver, on the same database) as the oracle where it has one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from psycopg.rows import dict_row

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.checkpointer._secrets import looks_secret as _looks_secret


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with psycopg.Connection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


@pytest.fixture
def peer(db: str) -> Iterator[PostgresSaver]:
    with psycopg.Connection.connect(
        db, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        yield PostgresSaver(conn)


@pytest.fixture
def ours(db: str) -> Iterator[DeterministicSaver]:
    with psycopg.Connection.connect(
        db, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        yield DeterministicSaver(conn, run_id_policy="off")


# --- (a) delta-channel history: an inline null is not a seed ----------------------------


def _chain(saver: BaseCheckpointSaver[Any], seed_value: Any) -> RunnableConfig:
    """Four checkpoints; step 1 stores ``seed_value`` for the channel, the others only
    bump its version; every step carries one write to it (w0..w3)."""
    thread_id = str(uuid.uuid4())
    parent: RunnableConfig | None = None
    for step in range(4):
        config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        checkpoint: Checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=step))
        checkpoint["channel_versions"]["items"] = f"v{step}"
        new_versions = {}
        if step == 1:
            checkpoint["channel_values"]["items"] = seed_value
            new_versions["items"] = "v1"
        parent = saver.put(config, checkpoint, {"source": "loop", "step": step}, new_versions)  # type: ignore[typeddict-item]
        saver.put_writes(parent, [("items", f"w{step}")], str(uuid.uuid4()))
    assert parent is not None
    return parent


@pytest.mark.parametrize("seed", [None, 0, False, "", 42, "x", True, [1, 2]])
def test_delta_history_matches_the_peer_for_every_inline_seed(
    peer: PostgresSaver, ours: DeterministicSaver, seed: Any
) -> None:
    results = []
    for saver in (peer, ours):
        head = _chain(saver, seed)
        history = saver.get_delta_channel_history(config=head, channels=["items"])["items"]
        results.append({**history, "writes": [w[2] for w in history["writes"]]})
    assert results[1] == results[0]


def test_a_stored_none_does_not_stop_the_walk(ours: DeterministicSaver) -> None:
    head = _chain(ours, None)
    history = ours.get_delta_channel_history(config=head, channels=["items"])["items"]
    # A JSON null reads as "nothing stored": replay from empty, w0 included.
    assert "seed" not in history
    assert [w[2] for w in history["writes"]] == ["w0", "w1", "w2"]


# --- (b) a serde assigned after construction is used ------------------------------------


class _XorCipher:
    """A toy cipher, enough to tell encrypted rows from plain msgpack."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def test_a_serde_assigned_after_construction_encrypts_what_is_stored(db: str) -> None:
    thread = f"serde-{uuid.uuid4().hex[:8]}"
    with DeterministicSaver(db, run_id_policy="off") as saver:
        saver.serde = EncryptedSerializer(_XorCipher())  # as LangGraph's sqlite_aes fixture
        graph = _echo_graph().compile(checkpointer=saver)
        graph.invoke({"messages": [("user", "secret plan")]}, {"configurable": {"thread_id": thread}})
        state = graph.get_state({"configurable": {"thread_id": thread}})
    assert [m.content for m in state.values["messages"]] == ["secret plan", "echo: secret plan"]
    with psycopg.connect(db) as conn:
        types = conn.execute(
            "SELECT type FROM checkpoint_blobs WHERE thread_id = %s AND type <> 'empty'"
            " UNION ALL SELECT type FROM checkpoint_writes WHERE thread_id = %s",
            (thread, thread),
        ).fetchall()
        raw = b"".join(
            bytes(r[0])
            for r in conn.execute(
                "SELECT blob FROM checkpoint_blobs WHERE thread_id = %s AND blob IS NOT NULL"
                " UNION ALL SELECT blob FROM checkpoint_writes WHERE thread_id = %s",
                (thread, thread),
            ).fetchall()
        )
    assert types and all(t[0].endswith("+xor") for t in types), types
    assert b"secret plan" not in raw


# --- (c) our randomness does not come from uuid.uuid4 -----------------------------------


def _echo_graph() -> StateGraph[MessagesState]:
    def echo(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"echo: {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("echo", echo)
    builder.add_edge(START, "echo")
    builder.add_edge("echo", END)
    return builder


def test_patched_uuid4_gives_the_same_ids_as_with_the_in_memory_saver(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph's ``deterministic_uuids`` fixture patches uuid.uuid4; a graph run under
    our saver (policy "require", which hands each run attempt a token) must see the same
    sequence as under InMemorySaver."""

    def message_ids(saver: BaseCheckpointSaver[Any], thread: str) -> list[str | None]:
        counter = iter(range(10_000))
        monkeypatch.setattr(
            uuid, "uuid4", lambda: uuid.UUID(f"00000000-0000-4000-8000-{next(counter):012}")
        )
        graph = _echo_graph().compile(checkpointer=saver)
        out = graph.invoke({"messages": [("user", "hi")]}, run_config(thread, f"{thread}:1"))
        out = graph.invoke({"messages": [("user", "again")]}, run_config(thread, f"{thread}:2"))
        monkeypatch.undo()
        return [m.id for m in out["messages"]]

    expected = message_ids(InMemorySaver(), "mem")
    with DeterministicSaver(db, run_id_policy="require") as saver:
        got = message_ids(saver, f"uuid-{uuid.uuid4().hex[:8]}")
    assert got == expected


# --- (d) secrets stay out of stored metadata --------------------------------------------

_SECRET_KEYS = [
    "api_key", "apiKey", "x-api-key", "OPENAI_API_KEY", "token", "access_token",
    "bearer", "Bearer", "authorization", "AuthHeader", "password", "passwd", "pwd",
    "db_pwd", "userPass", "passphrase", "secret", "client_secret", "credentials", "creds",
    "cookie", "session_id", "private_key", "signature", "jwt", "otp", "dsn", "pin",
]  # fmt: skip
_SECRET_VALUES = [
    "Bearer abc.def", "basic dXNlcjpwdw==", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln",
    "postgresql://app:hunter2@db:5432/prod", "host=db user=app password=hunter2",
    "sk-proj-0123456789abcdefABCDEF", "ghp_0123456789abcdefghij", "AKIAABCDEFGHIJKLMNOP",
]  # fmt: skip
_PLAIN = {"user": "ann", "tenant": "acme", "source_doc": "faq", "step_name": "plan", "n": 3}


@pytest.mark.parametrize("key", _SECRET_KEYS)
def test_secret_looking_keys_are_recognised(key: str) -> None:
    assert _looks_secret(key)


@pytest.mark.parametrize("value", _SECRET_VALUES)
def test_credential_shaped_values_are_recognised_whatever_the_key(value: str) -> None:
    assert _looks_secret("note", value)


@pytest.mark.parametrize(("key", "value"), sorted(_PLAIN.items()))
def test_plain_metadata_is_kept(key: str, value: Any) -> None:
    assert not _looks_secret(key, value)


def test_no_secret_reaches_a_stored_checkpoint(db: str, ours: DeterministicSaver) -> None:
    thread = f"meta-{uuid.uuid4().hex[:8]}"
    attached = {
        **{k: f"v-{i}-{k}" for i, k in enumerate(_SECRET_KEYS)},
        **{f"note{i}": v for i, v in enumerate(_SECRET_VALUES)},
        **_PLAIN,
    }
    config: RunnableConfig = {
        "configurable": {"thread_id": thread, "checkpoint_ns": "", "openai_api_key": "sk-x"},
        "metadata": attached,
    }
    ours.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
    with psycopg.connect(db) as conn:
        (stored,) = conn.execute(
            "SELECT metadata FROM checkpoints WHERE thread_id = %s", (thread,)
        ).fetchone() or (None,)
    assert stored is not None
    assert {k: stored[k] for k in _PLAIN} == _PLAIN
    leaked = [k for k in stored if k in attached and k not in _PLAIN]
    assert leaked == []
    assert "sk-x" not in repr(stored)  # configurable values are not copied (documented)


# --- prune: as PostgresSaver prunes, on every connection style --------------------------


def _put(
    saver: BaseCheckpointSaver[Any],
    thread: str,
    parent: RunnableConfig | None,
    step: int,
    *,
    ns: str = "",
    values: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    v: int = 4,
) -> RunnableConfig:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    values = values or {}
    versions = {k: str(step + 1) for k in values}
    checkpoint: Checkpoint = {
        **empty_checkpoint(),
        "v": v,
        "id": str(uuid6(clock_seq=step)),
        "channel_values": values,
        "channel_versions": versions,
    }
    meta = {"source": "loop", "step": step, "parents": {}, **(metadata or {})}
    return saver.put(config, checkpoint, meta, versions)  # type: ignore[arg-type]


def _namespaces(db: str, thread: str) -> dict[str, set[str]]:
    with psycopg.connect(db) as conn:
        return {
            table: {r[0] for r in conn.execute(
                f"SELECT checkpoint_ns FROM {table} WHERE thread_id = %s", (thread,)
            )}
            for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs")
        }  # fmt: skip


def _subgraph_calls_thread(saver: BaseCheckpointSaver[Any]) -> str:
    """A root with two checkpoints and four subgraph namespaces, each started from the
    older root checkpoint, the head, a root checkpoint not saved (yet), or - a
    checkpointer=True subgraph, whose namespace has no task id - the older one."""
    thread = str(uuid.uuid4())
    older = _put(saver, thread, None, 0)
    head = _put(saver, thread, older, 1)
    started_from = {
        "finished:1": older["configurable"]["checkpoint_id"],
        "interrupted:2": head["configurable"]["checkpoint_id"],
        "running:3": str(uuid6(clock_seq=2)),
        "checkpointer_true": older["configurable"]["checkpoint_id"],
    }
    for ns, root in started_from.items():
        parent = None
        for step in range(3):
            parent = _put(
                saver, thread, parent, step, ns=ns, values={"a": [step]},
                metadata={"parents": {"": root}},
            )  # fmt: skip
            saver.put_writes(parent, [("a", step)], str(uuid.uuid4()))
    return thread


def test_prune_deletes_a_subgraph_call_with_the_root_checkpoint_it_started_from(
    db: str, peer: PostgresSaver, ours: DeterministicSaver
) -> None:
    survivors = []
    for saver in (peer, ours):
        thread = _subgraph_calls_thread(saver)
        saver.prune([thread])
        survivors.append(_namespaces(db, thread))
    assert survivors[1] == survivors[0]
    assert survivors[1]["checkpoints"] == {"", "interrupted:2", "running:3", "checkpointer_true"}


def test_prune_keeps_a_pre_v4_heads_sends_parent_as_a_root(
    peer: PostgresSaver, ours: DeterministicSaver
) -> None:
    from langgraph.checkpoint.serde.types import TASKS

    seen = []
    for saver in (peer, ours):
        thread = str(uuid.uuid4())
        first = _put(saver, thread, None, 0, v=1)
        saver.put_writes(first, [(TASKS, "send-1")], str(uuid.uuid4()))
        second = _put(saver, thread, first, 1, v=1)
        head = _put(saver, thread, second, 2, v=1)
        saver.put_writes(second, [(TASKS, "send-2")], str(uuid.uuid4()))
        saver.prune([thread])
        loaded, kept = saver.get_tuple(head), saver.get_tuple(second)
        assert loaded is not None and kept is not None
        assert saver.get_tuple(first) is None
        seen.append(
            (loaded.checkpoint["channel_values"][TASKS], loaded.parent_config == second,
             kept.parent_config)
        )  # fmt: skip
    assert seen[1] == seen[0] == (["send-2"], True, None)


def test_prune_of_one_string_is_a_type_error_as_in_the_peer(ours: DeterministicSaver) -> None:
    with pytest.raises(TypeError, match="not a str"):
        ours.prune("ab")


@pytest.mark.parametrize("api", ["sync", "async"])
async def test_prune_on_a_connection_the_caller_holds_in_a_pipeline(
    db: str, peer: PostgresSaver, api: str
) -> None:
    """PostgresSaver(conn, pipe=conn.pipeline()) is a documented setup; the prune
    transaction sets its isolation level and must not collide with the open pipeline."""
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    thread = _subgraph_calls_thread(peer)
    if api == "sync":
        with psycopg.Connection.connect(db, **kwargs) as conn, conn.pipeline():
            DeterministicSaver(conn, run_id_policy="off").prune([thread])
    else:
        aconn = await psycopg.AsyncConnection.connect(db, **kwargs)
        async with aconn, aconn.pipeline():
            await DeterministicSaver(aconn, run_id_policy="off").aprune([thread])
    assert _namespaces(db, thread)["checkpoints"] == {
        "", "interrupted:2", "running:3", "checkpointer_true"
    }  # fmt: skip
    with psycopg.connect(db) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''",
            (thread,),
        ).fetchone() or (0,)
    assert count == 1


def test_prune_leaves_a_thread_that_turns_delta_after_the_check(
    db: str, ours: DeterministicSaver
) -> None:
    """A run saving a DeltaChannel checkpoint between prune's batch check and the
    thread's transaction: the transaction sees it on its snapshot and changes nothing."""
    from langgraph_deterministic._db import batch as _batch
    from langgraph_deterministic._db.drivers import execute as _execute
    from langgraph_deterministic.checkpointer import PruneRefusedError, _core

    plain, turning = str(uuid.uuid4()), str(uuid.uuid4())
    for thread in (plain, turning):
        head = _put(ours, thread, None, 0, values={"a": [0]})
        head = _put(ours, thread, head, 1, values={"a": [1]})
    before = _namespaces(db, turning)
    batches = 0

    def execute(batch: _batch.Batch) -> _batch.Results:
        nonlocal batches
        batches += 1
        if batches == 2:  # the batch check has passed: now a run turns the thread delta
            with DeterministicSaver(db, run_id_policy="off") as other:
                _put(other, turning, head, 2, metadata={"counters_since_delta_snapshot": {}})
        with psycopg.connect(db, autocommit=True) as conn:
            return _execute(conn, batch)

    with pytest.raises(PruneRefusedError, match=f"{turning}.*pruned before it: {plain}"):
        _batch.run(_core.prune([plain, turning], "keep_latest"), execute)
    with psycopg.connect(db) as conn:
        counts = {
            t: conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (t,))
            .fetchone()[0]  # type: ignore[index]
            for t in (plain, turning)
        }
    assert counts == {plain: 1, turning: 3}
    assert _namespaces(db, turning) == before


async def test_a_sync_call_on_the_event_loop_is_an_invalid_state_error(db: str) -> None:
    """As AsyncPostgresSaver: its tests (and callers) expect asyncio.InvalidStateError; from
    another thread the same call works."""
    import asyncio

    from langgraph_deterministic.errors import ConfigurationError

    aconn = await psycopg.AsyncConnection.connect(db, autocommit=True, row_factory=dict_row)
    async with aconn:
        saver = DeterministicSaver(aconn, run_id_policy="off")
        config: RunnableConfig = {"configurable": {"thread_id": "on-loop", "checkpoint_ns": ""}}
        await saver.aget_tuple(config)
        with pytest.raises(asyncio.InvalidStateError) as info:
            saver.get_tuple(config)
        assert isinstance(info.value, ConfigurationError)
        assert await asyncio.to_thread(saver.get_tuple, config) is None


# --- a direct put naming a parent the database never held (LangGraph's test_null_chars) --


@pytest.mark.parametrize("policy", ["warn", "off"])
def test_a_direct_put_without_run_id_may_name_an_absent_parent(db: str, policy: str) -> None:
    """The parent check against checkpoints lost in a failover covers writes with a run id;
    a direct put without one names any parent, as PostgresSaver allows."""
    with DeterministicSaver(db, run_id_policy=policy) as saver:  # type: ignore[arg-type]
        _put_on_an_absent_parent(saver, f"absent-parent-{policy}-{uuid.uuid4()}")


def test_the_peer_takes_a_direct_put_on_an_absent_parent(peer: PostgresSaver) -> None:
    _put_on_an_absent_parent(peer, f"absent-parent-peer-{uuid.uuid4()}")


def _put_on_an_absent_parent(saver: BaseCheckpointSaver[Any], thread: str) -> None:
    config: RunnableConfig = {
        "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": "1"}
    }
    stored = saver.put(config, empty_checkpoint(), {"my_key": "\x00abc"}, {})
    found = saver.get_tuple(stored)
    assert found is not None and found.metadata["my_key"] == "abc"
    assert found.parent_config is not None
    assert found.parent_config["configurable"]["checkpoint_id"] == "1"
