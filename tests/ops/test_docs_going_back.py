"""docs/how-to/going-back.md as written: its commands run through ``cli.main`` and its
Python block runs, on a database of ours, and the thread written through DeterministicSaver
then continues under PostgresSaver."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.ops import _agent

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic._db.migrate import DEFAULT_LOCK_RETRIES, DEFAULT_LOCK_TIMEOUT
from langgraph_deterministic.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "going-back.md"
TEXT = DOC.read_text("utf-8")


def _block(lang: str) -> str:
    (block,) = re.findall(rf"```{lang}\n(.*?)```", TEXT, flags=re.DOTALL)
    return str(block)


@pytest.fixture()
def ours(pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_back")
    monkeypatch.setenv("DATABASE_URL", dsn)
    try:
        with DeterministicSaver(dsn) as saver:
            saver.setup()
            graph = _agent.build().compile(checkpointer=saver)
            graph.invoke({"messages": [("user", "hi")]}, run_config("t1", "r1"))
        yield dsn
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in rows}


def test_the_commands_run(ours: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [ln.split("#")[0].strip() for ln in _block("bash").splitlines()]
    (dry, real) = [shlex.split(ln) for ln in lines if ln]
    assert dry[-1] == "--dry-run" and real[0] == "langgraph-deterministic"
    before = _tables(ours)
    assert main(dry[1:]) == 0
    assert "DROP TABLE IF EXISTS" in capsys.readouterr().out and _tables(ours) == before
    assert main(real[1:]) == 0
    assert _tables(ours) == {"checkpoints", "checkpoint_blobs", "checkpoint_writes",
                             "checkpoint_migrations"}  # fmt: skip


def test_the_python_block_runs_and_the_thread_continues(ours: str) -> None:
    scope: dict[str, Any] = {"DATABASE_URL": ours, "builder": _agent.build()}
    exec(compile(_block("python"), str(DOC), "exec"), scope)
    assert "lgd_runs" not in _tables(ours)
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(ours) as saver:
        graph = _agent.build().compile(checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": "t1"}}
        out = graph.invoke({"messages": [("user", "again")]}, cfg)
        assert _agent.texts_of(out["messages"]) == ["hi", "again"]
        assert not graph.get_state(cfg).next


def test_the_defaults_quoted_are_the_cli_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    flat = " ".join(TEXT.split())
    assert f"seconds (default {DEFAULT_LOCK_TIMEOUT:g})" in flat
    assert f"`--lock-retries` times (default {DEFAULT_LOCK_RETRIES})" in flat
    assert main(["uninstall", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default {DEFAULT_LOCK_TIMEOUT:g})" in help_text
    assert f"(default {DEFAULT_LOCK_RETRIES})" in help_text
