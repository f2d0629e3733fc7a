"""Retention sweeps (saver.sweep, ``langgraph-deterministic prune``) on a real Postgres.

Threads of every kind are written by real graph runs (and by langgraph's PostgresSaver),
then "aged" by sweeping at a later ``now``: the ones written before the cutoff are past
their TTL, the ones written after are young. After the sweep exactly the expired threads
are gone (delete) or trimmed (keep_latest), every kept one resumes and takes a new turn,
a retry of a swept run raises RunSweptError with the thread holding its input once, and
no table holds a row of a thread that is gone or of a checkpoint that is gone.
"""

from __future__ import annotations

import datetime as dt
import operator
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import (
    CheckpointPrunedError,
    DeterministicRunner,
    DeterministicSaver,
    PostgresJournal,
    RetentionPolicy,
    RunSweptError,
    durable_sync,
    is_retryable,
    run_config,
)
from langgraph_deterministic.cli import main
from langgraph_deterministic.retention import checkpoint_time

HOUR = dt.timedelta(hours=1)
TABLES = (
    "checkpoints", "checkpoint_blobs", "checkpoint_writes", "lgd_chain", "lgd_runs",
    "lgd_leases", "lgd_queue", "lgd_journal", "lgd_journal_attempts", "lgd_repairs",
)  # fmt: skip


class S(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    tally: Annotated[list[str], operator.add]


def _reply(state: S) -> dict[str, Any]:
    last = state["messages"][-1]
    return {"messages": [AIMessage(content=f"re: {last.content}")]}


def chat() -> StateGraph[Any]:
    g = StateGraph(S)
    g.add_node("reply", _reply)
    g.add_edge(START, "reply")
    return g


def asking() -> StateGraph[Any]:
    def ask(state: S) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"messages": [AIMessage(content=f"approved: {answer}")]}

    g = StateGraph(S)
    g.add_node("reply", _reply)
    g.add_node("ask", ask)
    g.add_edge(START, "reply")
    g.add_edge("reply", "ask")
    return g


def nested() -> StateGraph[Any]:
    sub = StateGraph(S)
    sub.add_node("inner", lambda s: {"tally": ["inner"]})
    sub.add_edge(START, "inner")
    g = StateGraph(S)
    g.add_node("reply", _reply)
    g.add_node("sub", sub.compile())
    g.add_edge(START, "reply")
    g.add_edge("reply", "sub")
    return g


def journaled() -> StateGraph[Any]:
    def reply(state: S) -> dict[str, Any]:
        last = state["messages"][-1].content
        echoed = durable_sync("echo", _echo, last)
        return {"messages": [AIMessage(content=f"re: {echoed}")]}

    g = StateGraph(S)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    return g


def _echo(text: str) -> str:
    return text


try:
    from langgraph.channels.delta import DeltaChannel
except ImportError:  # an older LangGraph: no DeltaChannel thread in the scenario
    DeltaChannel = None


def _append(cur: list[str], writes: list[list[str]]) -> list[str]:
    return [*cur, *(x for w in writes for x in w)]


if DeltaChannel is not None:

    class D(TypedDict, total=False):
        messages: Annotated[list[AnyMessage], add_messages]
        notes: Annotated[list[str], DeltaChannel(_append, snapshot_frequency=2)]


def delta() -> StateGraph[Any] | None:
    if DeltaChannel is None:
        return None

    def note(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content="noted")], "notes": ["n"]}

    g = StateGraph(D)
    g.add_node("note", note)
    g.add_edge(START, "note")
    return g


def turn(saver: DeterministicSaver, builder: StateGraph[Any], thread: str, run: str,
         text: str) -> Any:  # fmt: skip
    return builder.compile(checkpointer=saver).invoke(
        {"messages": [("user", text)]}, run_config(thread, run)
    )


def _notes(saver: DeterministicSaver, thread: str | None) -> list[str] | None:
    builder = delta()
    if thread is None or builder is None:
        return None
    state = builder.compile(checkpointer=saver).get_state({"configurable": {"thread_id": thread}})
    return list(state.values.get("notes", []))


def inputs_of(saver: DeterministicSaver, thread: str, text: str) -> int:
    tup = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    if tup is None:
        return 0
    msgs = tup.checkpoint["channel_values"].get("messages", [])
    return sum(1 for m in msgs if m.type == "human" and m.content == text)


def orphans(dsn: str) -> dict[str, int]:
    """Rows that belong to nothing: of a checkpoint that is gone, or a thread that is."""
    checks = {
        "writes": "SELECT count(*) FROM checkpoint_writes w WHERE NOT EXISTS (SELECT 1 FROM "
        "checkpoints c WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns "
        "AND c.checkpoint_id = w.checkpoint_id)",
        "blobs": "SELECT count(*) FROM checkpoint_blobs b WHERE NOT EXISTS (SELECT 1 FROM "
        "checkpoints c WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns "
        "AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)",
        "chain": "SELECT count(*) FROM lgd_chain ch WHERE ch.checkpoint_id NOT LIKE 'refused:%' "
        "AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = ch.thread_id "
        "AND c.checkpoint_ns = ch.checkpoint_ns AND c.checkpoint_id = ch.checkpoint_id)",
        "journal": "SELECT count(*) FROM lgd_journal j WHERE NOT EXISTS (SELECT 1 FROM "
        "checkpoints c WHERE c.thread_id = j.thread_id AND c.checkpoint_ns = j.checkpoint_ns "
        "AND c.checkpoint_id = j.checkpoint_id)",
        "runs": "SELECT count(*) FROM lgd_runs r WHERE NOT EXISTS (SELECT 1 FROM checkpoints c "
        "WHERE c.thread_id = r.thread_id)",
        "attempts": "SELECT count(*) FROM lgd_journal_attempts a WHERE NOT EXISTS (SELECT 1 "
        "FROM lgd_runs r WHERE r.thread_id = a.thread_id AND r.run_id = a.run_id)",
        "leases": "SELECT count(*) FROM lgd_leases l WHERE NOT EXISTS (SELECT 1 FROM "
        "checkpoints c WHERE c.thread_id = l.thread_id)",
        "repairs": "SELECT count(*) FROM lgd_repairs p WHERE NOT EXISTS (SELECT 1 FROM "
        "checkpoints c WHERE c.thread_id = p.thread_id) OR NOT EXISTS (SELECT 1 FROM "
        "checkpoints c WHERE c.thread_id = p.backup_thread_id)",
        "tombstoned_but_live": "SELECT count(*) FROM lgd_swept_runs s JOIN lgd_runs r "
        "USING (thread_id, run_id)",
    }
    with psycopg.connect(dsn) as conn:
        return {k: n for k, q in checks.items() if (n := conn.execute(q).fetchone()[0])}  # type: ignore[index]


def rows_of(dsn: str, thread: str) -> int:
    with psycopg.connect(dsn) as conn:
        return sum(
            conn.execute(f"SELECT count(*) FROM {t} WHERE thread_id = %s", (thread,)).fetchone()[0]  # type: ignore[index]
            for t in TABLES
        )


@pytest.fixture(scope="module")
def db(pg_server_dsn: str) -> Iterator[str]:
    fresh = create_database(pg_server_dsn, prefix="lgd_retention")
    with DeterministicSaver(fresh) as saver:
        saver.setup()
    try:
        yield fresh
    finally:
        drop_database(pg_server_dsn, database_name(fresh))


@pytest.fixture
def fresh_db(pg_server_dsn: str) -> Iterator[str]:
    """A database of its own, for a test that counts every thread in it."""
    fresh = create_database(pg_server_dsn, prefix="lgd_retention_all")
    with DeterministicSaver(fresh) as saver:
        saver.setup()
    try:
        yield fresh
    finally:
        drop_database(pg_server_dsn, database_name(fresh))


def _new() -> str:
    return str(uuid.uuid4())


def populate(dsn: str) -> dict[str, str]:
    """One thread of each kind; returns kind -> thread id."""
    t: dict[str, str] = {}
    with DeterministicSaver(dsn) as saver:
        t["finished"] = _new()
        turn(saver, chat(), t["finished"], "fin-1", "hello")
        turn(saver, chat(), t["finished"], "fin-2", "again")
        t["interrupted"] = _new()
        turn(saver, asking(), t["interrupted"], "ask-1", "please")
        t["leased"] = _new()
        turn(saver, chat(), t["leased"], "lease-1", "busy")
        t["queued"] = _new()
        turn(saver, chat(), t["queued"], "queue-1", "waiting")
        t["repaired"] = _new()
        turn(saver, chat(), t["repaired"], "rep-1", "fixed")
        backup = f"lgd-backup:r-{t['repaired'][:8]}:{t['repaired']}"
        saver.copy_thread(t["repaired"], backup)
        t["subgraph"] = _new()
        turn(saver, nested(), t["subgraph"], "sub-1", "nest")
        turn(saver, nested(), t["subgraph"], "sub-2", "nest again")
        graph = journaled().compile(checkpointer=saver)
        t["journal"] = _new()
        DeterministicRunner(journal=PostgresJournal(saver)).invoke(
            graph, {"messages": [("user", "journal")]}, run_config(t["journal"], "jr-1")
        )
        if (d := delta()) is not None:
            t["delta"] = _new()
            for i in range(5):  # a snapshot every 2 updates: the window is 1-2 turns
                turn(saver, d, t["delta"], f"delta-{i}", f"d{i}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # a run in flight holds the thread's lease; a run waits in its queue
        conn.execute(
            "UPDATE lgd_leases SET ended = NULL, expires_at = now() + interval '1 hour' "
            "WHERE thread_id = %s", (t["leased"],),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO lgd_queue (thread_id, run_id, expires_at) "
            "VALUES (%s, 'queued-run', now() + interval '1 hour')", (t["queued"],),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO lgd_repairs (repair_id, thread_id, faults, actions, old_head, "
            "backup_thread_id) SELECT %s, %s, '{dangling_tool_call}', '[]', "
            "max(checkpoint_id), %s FROM checkpoints WHERE thread_id = %s",
            (f"r-{t['repaired'][:8]}", t["repaired"], backup, t["repaired"]),
        )
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(dsn) as peer:
        t["peer"] = _new()
        chat().compile(checkpointer=peer).invoke(
            {"messages": [("user", "from the peer")]},
            {"configurable": {"thread_id": t["peer"]}},
        )
    return t


def test_checkpoint_time_reads_langgraphs_uuid6() -> None:
    from langgraph.checkpoint.base.id import uuid6

    before = dt.datetime.now(dt.UTC)
    found = checkpoint_time(str(uuid6(clock_seq=3)))
    assert found is not None and abs(found - before) < dt.timedelta(seconds=1)
    assert checkpoint_time(str(uuid.uuid4())) is None
    assert checkpoint_time("not-a-uuid") is None


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
def test_sweep_removes_exactly_the_expired_threads(fresh_db: str, strategy: str) -> None:
    db = fresh_db
    old = populate(db)
    cutoff = dt.datetime.now(dt.UTC)
    young = {"young": _new()}
    with DeterministicSaver(db) as saver:
        turn(saver, chat(), young["young"], "young-1", "fresh")
        later = cutoff + 30 * 24 * HOUR  # a month on: the old ones are 30 days old
        # the sweep's cutoff is `cutoff`: every old thread is past it, the young one is not
        policy = RetentionPolicy(default_ttl=30 * 24 * HOUR, strategy=strategy)  # type: ignore[arg-type]
        dry = saver.sweep(policy, now=later)
        assert not dry.applied and dry.rows_freed == 0
        assert orphans(db) == {}
        expected_skips = {"leased": [old["leased"]], "queued": [old["queued"]],
                          "interrupted": [old["interrupted"]]}  # fmt: skip
        assert dry.skipped == expected_skips
        sweepable = {k for k in old if k not in ("leased", "queued", "interrupted")}
        assert set(dry.swept) == {old[k] for k in sweepable}, (set(dry.swept) - {old[k] for k in sweepable}, old)
        assert young["young"] not in dry.expired
        footprint = {k: rows_of(db, v) for k, v in old.items()}

        notes = _notes(saver, old.get("delta"))
        report = saver.sweep(policy, now=later, apply=True)
        assert report.skipped == expected_skips
        swept = sweepable
        assert set(report.swept) == {old[k] for k in swept}
        assert report.rows_freed > 0 and report.bytes_freed > 0
        assert orphans(db) == {}
        backup = f"lgd-backup:r-{old['repaired'][:8]}:{old['repaired']}"
        assert rows_of(db, backup) == 0  # the repair backup went with its thread

        for kind in swept:
            left = rows_of(db, old[kind])
            if strategy == "delete":
                assert left == 0, kind
            else:
                assert 0 < left < footprint[kind] or kind in ("peer",), kind
        for kind in set(old) - swept:
            assert rows_of(db, old[kind]) == footprint[kind], kind  # untouched

        # a retry of a swept run is refused, never applied again
        with pytest.raises(RunSweptError, match=r"fin-1.*swept by a retention sweep") as info:
            turn(saver, chat(), old["finished"], "fin-1", "hello")
        assert not is_retryable(info.value) and info.value.run_id == "fin-1"
        assert inputs_of(saver, old["finished"], "hello") == (
            0 if strategy == "delete" else 1
        )
        if strategy == "delete":
            with pytest.raises(RunSweptError, match="fin-2"):
                turn(saver, chat(), old["finished"], "fin-2", "again")
        assert orphans(db) == {}

        # every kept thread, and every trimmed one, resumes and takes a new turn
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE lgd_leases SET ended = 'ok', expires_at = now() WHERE thread_id = %s",
                         (old["leased"],))  # fmt: skip
        answered = asking().compile(checkpointer=saver).invoke(
            Command(resume="yes"), run_config(old["interrupted"], "ask-2")
        )
        assert answered["messages"][-1].content == "approved: yes"
        kept = ["leased", "queued", "young"] + (
            [k for k in swept] if strategy == "keep_latest" else []
        )
        ids = {**old, **young}
        for kind in kept:
            if kind == "peer":
                continue
            builder = {"subgraph": nested(), "delta": delta()}.get(kind) or chat()
            if kind == "delta":  # trimmed to its window: the value rebuilds as before
                assert _notes(saver, ids[kind]) == notes == ["n"] * 5
            out = turn(saver, builder, ids[kind], f"{kind}-next", "next turn")
            assert out["messages"][-1].content.startswith("re: next turn") or kind == "delta"
            if kind == "delta":
                assert _notes(saver, ids[kind]) == ["n"] * 6
        assert orphans(db) == {}


def test_keep_latest_time_travel_to_a_pruned_checkpoint_names_the_sweep(db: str) -> None:
    thread = _new()
    with DeterministicSaver(db) as saver:
        turn(saver, chat(), thread, "tt-1", "one")
        first = saver.get_tuple({"configurable": {"thread_id": thread}})
        assert first is not None
        turn(saver, chat(), thread, "tt-2", "two")
        later = dt.datetime.now(dt.UTC) + 2 * HOUR
        report = saver.sweep(older_than=HOUR, strategy="keep_latest", apply=True, now=later)
        assert thread in report.swept
        graph = chat().compile(checkpointer=saver)
        config = run_config(thread, "tt-3", checkpoint_id=first.config["configurable"]["checkpoint_id"])
        with pytest.raises(CheckpointPrunedError, match="retention sweep removed it"):
            graph.invoke({"messages": [("user", "three")]}, config)
        # the retry of the run whose head was kept still works as a retry
        again = turn(saver, chat(), thread, "tt-2", "two")
        assert inputs_of(saver, thread, "two") == 1
        assert again["messages"][-1].content == "re: two"


def test_a_retry_after_the_tombstone_expired_is_new_input(db: str) -> None:
    """What tombstone_ttl protects: once a swept run's tombstone is gone too, the run is
    unknown and its retry is applied as new input to the emptied thread."""
    thread = _new()
    with DeterministicSaver(db) as saver:
        turn(saver, chat(), thread, "gone-1", "once")
        later = dt.datetime.now(dt.UTC) + 2 * HOUR
        saver.sweep(older_than=HOUR, apply=True, now=later)
        with pytest.raises(RunSweptError):
            turn(saver, chat(), thread, "gone-1", "once")
        report = saver.sweep(
            RetentionPolicy(default_ttl=HOUR, tombstone_ttl=dt.timedelta(microseconds=1)),
            apply=True,
        )
        assert report.tombstones_expired >= 1
        out = turn(saver, chat(), thread, "gone-1", "once")  # applied again
        assert [m.content for m in out["messages"]] == ["once", "re: once"]


def test_per_thread_ttl_override(db: str) -> None:
    short, never, plain = _new(), _new(), _new()
    with DeterministicSaver(db) as saver:
        g = chat().compile(checkpointer=saver)
        for thread, ttl in ((short, 5), (never, "never"), (plain, None)):
            config = run_config(thread, f"{thread}-1")
            if ttl is not None:
                config["metadata"]["retention_ttl_minutes"] = ttl
            g.invoke({"messages": [("user", "x")]}, config)
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
        found = saver.sweep(older_than="2w", now=later)
        assert short in found.swept and never not in found.expired and plain not in found.expired
        found = saver.sweep(RetentionPolicy(default_ttl=None), now=later + 30 * 24 * HOUR)
        assert short in found.swept and never not in found.expired and plain not in found.expired


def test_a_sweep_racing_a_new_run_loses_cleanly(db: str) -> None:
    """The sweep's claim holds the thread's lease row: a run starting meanwhile waits for
    the sweep's transaction, then starts on the thread as the sweep left it; a run that
    wrote since the scan makes the sweep leave the thread."""
    import threading

    thread = _new()
    with DeterministicSaver(db) as saver:
        turn(saver, chat(), thread, "race-1", "first")
        with psycopg.connect(db) as conn:
            latest = conn.execute(
                "SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %s", (thread,)
            ).fetchone()[0]  # type: ignore[index]
            before = dt.datetime.now(dt.UTC) + HOUR
            verdict = conn.execute(
                "SELECT verdict FROM lgd_sweep_claim_v1(%s, %s, %s, 'delete', false, 'tok', "
                "'200ms')", (thread, latest, before),
            ).fetchone()[0]  # type: ignore[index]  # fmt: skip
            assert verdict == "go"
            done: list[Any] = []
            runner = threading.Thread(
                target=lambda: done.append(turn(saver, chat(), thread, "race-2", "second"))
            )
            runner.start()
            runner.join(0.5)
            assert runner.is_alive()  # the run waits for the sweep's transaction
            conn.execute("SELECT lgd_sweep_delete_v1(%s, 'tok')", (thread,))
            pid = conn.info.backend_pid
            with psycopg.connect(db, autocommit=True) as look:
                modes = {r[0] for r in look.execute(
                    "SELECT mode FROM pg_locks WHERE pid = %s AND locktype = 'relation'", (pid,)
                )}  # fmt: skip
            # row locks only: no table lock that would queue other threads' runs
            assert modes <= {"AccessShareLock", "RowShareLock", "RowExclusiveLock"}, modes
            conn.commit()
        runner.join(30)
        assert [m.content for m in done[0]["messages"]] == ["second", "re: second"]
        assert orphans(db) == {}
        # the run wrote after this scan: the stale claim leaves the thread
        with psycopg.connect(db) as conn:
            verdict = conn.execute(
                "SELECT verdict FROM lgd_sweep_claim_v1(%s, %s, %s, 'delete', false, 'tok2', "
                "'200ms')", (thread, latest, before),
            ).fetchone()[0]  # type: ignore[index]  # fmt: skip
            conn.commit()
        assert verdict == "written"
        assert inputs_of(saver, thread, "second") == 1


def test_dry_run_on_a_database_only_postgres_saver_wrote(pg_server_dsn: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    peer_db = create_database(pg_server_dsn, prefix="lgd_retention_peer")
    try:
        thread = _new()
        with PostgresSaver.from_conn_string(peer_db) as peer:
            peer.setup()
            chat().compile(checkpointer=peer).invoke(
                {"messages": [("user", "hi")]}, {"configurable": {"thread_id": thread}}
            )
        later = dt.datetime.now(dt.UTC) + 2 * HOUR
        with DeterministicSaver(peer_db, run_id_policy="off") as saver:
            report = saver.sweep(older_than=HOUR, now=later)
            assert report.swept == [thread] and not report.ours
        assert main(["prune", "--dsn", peer_db, "--older-than", "1h", "--dry-run"]) == 0
        # --apply needs the migrations (the tombstones): refused, nothing deleted
        assert main(["prune", "--dsn", peer_db, "--older-than", "1s", "--apply"]) == 1
        with psycopg.connect(peer_db) as conn:
            assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] > 0  # type: ignore[index]
    finally:
        drop_database(pg_server_dsn, database_name(peer_db))


def _threads(dsn: str, n: int, builder: Any = None) -> list[str]:
    ids = [_new() for _ in range(n)]
    with DeterministicSaver(dsn) as saver:
        for i, thread in enumerate(ids):
            turn(saver, builder or chat(), thread, f"cli-{i}", f"text {i}")
    return ids


def test_prune_cli_every_option(fresh_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import time

    db = fresh_db
    plain = _threads(db, 3)
    (asked,) = _threads(db, 1, asking())
    time.sleep(1.2)  # all four are now older than 1s
    base = ["prune", "--dsn", db, "--older-than", "1s"]

    assert main([*base, "--dry-run", "--json", "--batch-size", "2"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert sorted(dry["swept"]) == sorted(plain) and dry["skipped"] == {"interrupted": [asked]}
    assert dry["applied"] is False and dry["scanned"] == 4

    assert main([*base, "--expire-interrupted", "--strategy", "keep_latest"]) == 0
    out = capsys.readouterr().out
    assert "would sweep 4 (keep_latest)" in out and "dry run: nothing deleted" in out

    assert main([*base, "--apply", "--limit", "1", "--throttle", "0.01", "--lock-timeout",
                 "0.5", "--tombstone-ttl", "30d"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "swept 1 (delete)" in out and "freed" in out
    assert sum(rows_of(db, t) == 0 for t in plain) == 1

    assert main([*base, "--apply", "--every", "1s", "--sweeps", "2", "--json"]) == 0
    first, second = (json.loads(chunk) for chunk in _json_chunks(capsys.readouterr().out))
    assert len(first["swept"]) == 2 and second["swept"] == []
    assert second["skipped"] == {"interrupted": [asked]}
    assert all(rows_of(db, t) == 0 for t in plain) and rows_of(db, asked) > 0

    assert main([*base, "--apply", "--expire-interrupted"]) == 0
    assert rows_of(db, asked) == 0 and orphans(db) == {}
    capsys.readouterr()
    assert main(["prune", "--dsn", db, "--older-than", "soon"]) == 2  # a usage error
    assert "is not a duration" in capsys.readouterr().err
    assert main(["prune", "--dsn", db, "--dry-run", "--apply"]) == 2
    assert main(["prune", "--dsn", db]) == 0  # no TTL: only per-thread overrides expire
    assert "only threads with their own" in capsys.readouterr().err


def _json_chunks(text: str) -> list[str]:
    """The JSON documents printed one after another (indent=2: each ends with '}' alone)."""
    chunks, cur = [], []
    for line in text.splitlines():
        cur.append(line)
        if line == "}":
            chunks.append("\n".join(cur))
            cur = []
    return chunks


def test_a_sweep_killed_midway_is_finished_by_the_next(fresh_db: str) -> None:
    """SIGKILL a `prune --apply` after it swept some threads: each thread is whole or
    gone, and a second sweep removes the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    db = fresh_db
    threads = _threads(db, 12, nested())
    whole = {t: rows_of(db, t) for t in threads}
    time.sleep(1.2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "langgraph_deterministic", "prune", "--dsn", db,
         "--older-than", "1s", "--apply", "--throttle", "0.15"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with psycopg.connect(db) as conn:
                n = conn.execute("SELECT count(*) FROM lgd_swept_threads").fetchone()[0]  # type: ignore[index]
            if n >= 3:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    left = {t: rows_of(db, t) for t in threads}
    assert all(left[t] in (0, whole[t]) for t in threads), (left, whole)
    gone = sum(left[t] == 0 for t in threads)
    assert 3 <= gone < len(threads)
    assert orphans(db) == {}
    assert main(["prune", "--dsn", db, "--older-than", "1s", "--apply"]) == 0
    assert all(rows_of(db, t) == 0 for t in threads) and orphans(db) == {}


def test_docs_page_snippets_and_commands(
    fresh_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/how-to/retention.md: every python block as written, in order, on one database
    (the names it assumes from tests/test_docs_snippets.givens), a month later by the
    sweep's clock; every command line through main([...])."""
    import re
    import shlex

    from tests.test_docs_snippets import DOCS, blocks, givens, run_snippet

    from langgraph_deterministic import retention

    db = fresh_db
    monkeypatch.setenv("DATABASE_URL", db)
    page = DOCS / "how-to" / "retention.md"
    stack: list[Any] = []
    namespace = givens(db, stack)
    try:
        python = [code for reason, code in blocks(page) if reason is None]
        assert len(python) == 4 and not [r for r, _ in blocks(page) if r is not None]
        run_snippet(python[0], "retention.md[0]", namespace)  # the run with its own TTL
        thread_id = namespace["thread_id"]
        assert rows_of(db, thread_id) > 0
        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
        monkeypatch.setattr(retention, "_now", lambda: later)
        capsys.readouterr()
        for index, code in enumerate(python[1:], 1):
            run_snippet(code.replace('"postgresql://..."', repr(db)), f"retention.md[{index}]",
                        namespace)  # fmt: skip
        out = capsys.readouterr().out
        assert "1 threads would be swept" in out and "swept 1 threads" in out
        assert f"Run 'docs-run-1' on thread {thread_id!r} was swept" in out
        assert rows_of(db, thread_id) == 0

        text = page.read_text("utf-8")
        commands = re.findall(r"```bash\n(.*?)```", text, re.S)
        lines = [ln for block in commands for ln in block.splitlines() if ln.strip()]
        assert len(lines) == 3
        for line in lines:
            argv = shlex.split(line)
            assert argv[0] == "langgraph-deterministic"
            if "--every" in argv:
                argv.append("--sweeps=1")  # the page's loop, stopped after one sweep
            assert main([*argv[1:], "--dsn", db]) == 0
    finally:
        for obj in reversed(stack):
            obj.close()


def test_asweep_and_the_background_sweeper(db: str) -> None:
    import asyncio

    from langgraph_deterministic import Sweeper, SweepReport

    threads = _threads(db, 3)
    later = dt.datetime.now(dt.UTC) + 2 * HOUR

    async def swept_async() -> SweepReport:
        async with DeterministicSaver(db) as saver:
            dry = await saver.asweep(older_than="1h", now=later)
            assert set(threads) <= set(dry.swept) and not dry.applied
            return await saver.asweep(RetentionPolicy(default_ttl=HOUR),
                                      apply=True, now=later)  # fmt: skip

    report = asyncio.run(swept_async())
    assert set(threads) <= set(report.swept) and all(rows_of(db, t) == 0 for t in threads)

    # the thread sweeper: sweeps at once, then every interval, until stopped
    seen: list[SweepReport] = []
    more = _threads(db, 2)
    with DeterministicSaver(db) as saver:
        sweeper = Sweeper(saver, RetentionPolicy(default_ttl=dt.timedelta(seconds=1)),
                          interval=dt.timedelta(seconds=0.2), on_sweep=seen.append)  # fmt: skip
        import time

        time.sleep(1.1)
        sweeper.start()
        deadline = time.monotonic() + 20
        while not any(set(more) <= set(r.swept) for r in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        sweeper.stop()
        assert any(set(more) <= set(r.swept) for r in seen) and len(sweeper.reports) >= 1

    # the asyncio sweeper: a task, cancelled at shutdown; a failing sweep is reported
    errors: list[BaseException] = []

    async def serve() -> None:
        async with DeterministicSaver(db) as saver:
            policy = RetentionPolicy(default_ttl=HOUR, strategy="keep_latest")
            sweeper = Sweeper(saver, policy, interval=dt.timedelta(seconds=0.1),
                              on_error=errors.append)  # fmt: skip
            task = asyncio.create_task(sweeper.aserve())
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert sweeper.reports and not errors

    asyncio.run(serve())


def test_a_thread_whose_lease_row_is_locked_is_skipped_busy(db: str) -> None:
    (thread,) = _threads(db, 1)
    later = dt.datetime.now(dt.UTC) + 2 * HOUR
    with psycopg.connect(db) as holder:
        holder.execute("SELECT 1 FROM lgd_leases WHERE thread_id = %s FOR UPDATE", (thread,))
        with DeterministicSaver(db) as saver:
            report = saver.sweep(
                RetentionPolicy(default_ttl=HOUR, lock_timeout=0.05), apply=True, now=later
            )
        assert report.skipped.get("busy") == [thread] and rows_of(db, thread) > 0
        holder.rollback()
    # a row of the thread locked past lock_timeout after the claim: rolled back whole
    with psycopg.connect(db) as holder:
        holder.execute(
            "SELECT 1 FROM checkpoint_blobs WHERE thread_id = %s LIMIT 1 FOR UPDATE", (thread,)
        )
        whole = rows_of(db, thread)
        with DeterministicSaver(db) as saver:
            report = saver.sweep(
                RetentionPolicy(default_ttl=HOUR, lock_timeout=0.05), apply=True, now=later
            )
        assert report.skipped.get("busy") == [thread] and rows_of(db, thread) == whole
        holder.rollback()
    with DeterministicSaver(db) as saver:
        assert thread in saver.sweep(older_than=HOUR, apply=True, now=later).swept
    assert rows_of(db, thread) == 0 and orphans(db) == {}


def test_policy_and_argument_errors_name_the_fix() -> None:
    from langgraph_deterministic import ConfigurationError
    from langgraph_deterministic.retention import parse_duration

    with pytest.raises(ConfigurationError, match="'delete' or 'keep_latest'"):
        RetentionPolicy(default_ttl=HOUR, strategy="trim")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="positive"):
        RetentionPolicy(default_ttl=-HOUR)
    with pytest.raises(ConfigurationError, match=r"e\.g\. 30d"):
        parse_duration("a month")
    assert parse_duration("2w") == dt.timedelta(days=14)


def test_last_write_falls_back_to_the_checkpoints_ts() -> None:
    """A checkpoint id that is not a uuid6 (a hand-made one): its checkpoint["ts"] counts;
    with neither, the thread never expires; the ledger's updated_at counts when newer."""
    from langgraph_deterministic.retention import _candidates

    policy = RetentionPolicy(default_ttl=HOUR)
    old = "2020-01-01T00:00:00+00:00"
    ledger = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    rows = [
        ("a", "custom-1", old, None, False, None, False, False, False),
        ("b", "custom-2", "not a time", None, False, None, False, False, False),
        ("c", "custom-3", old, None, False, ledger, False, False, False),
        ("d", "custom-4", old, None, False, None, False, False, True),  # a repair backup
        ("e", "custom-5", "2020-01-01T00:00:00", 90, False, None, False, False, False),
    ]
    found = {c.thread_id: c for c in _candidates(rows, policy)}
    assert set(found) == {"a", "c", "e"}
    assert found["a"].last_write == dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    assert found["c"].last_write == ledger
    assert found["e"].ttl == dt.timedelta(minutes=90)


def test_a_retry_of_a_run_whose_final_checkpoint_prune_removed(db: str) -> None:
    """saver.prune(keep_latest) keeps the ledger rows: a retry of a finished run whose
    last checkpoint it removed is refused, not run again on the thread's latest state."""
    thread = _new()
    with DeterministicSaver(db) as saver:
        turn(saver, chat(), thread, "pr-1", "first")
        turn(saver, chat(), thread, "pr-2", "second")
        saver.prune([thread], strategy="keep_latest")
        with pytest.raises(RunSweptError, match="had its checkpoints pruned"):
            turn(saver, chat(), thread, "pr-1", "first")
        assert inputs_of(saver, thread, "first") == 1
