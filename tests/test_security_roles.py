"""The Security page's grants, run as written (role names made unique), and what each role
then does: workers run graphs, retries, time travel, copy/prune/delete and ``repair
--apply`` with no DDL (their ``setup()`` changes nothing); the auditor runs ``audit`` with
SELECT only and cannot write."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph
from psycopg.conninfo import make_conninfo

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import ConfigurationError, DeterministicSaver, run_config
from langgraph_deterministic.ops.audit import audit
from langgraph_deterministic.ops.repair import repair

PAGE = Path(__file__).resolve().parents[1] / "docs" / "explanation" / "security.md"


def _grants() -> str:
    (block,) = re.findall(r"```sql\n(.*?)```", PAGE.read_text("utf-8"), re.S)
    return block


class Boom(Exception):
    pass


def _graph(saver: DeterministicSaver) -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        if state["messages"][-1].content == "boom":
            raise Boom
        return {"messages": [AIMessage("ok")]}

    return StateGraph(MessagesState).add_node(reply).add_edge(START, "reply").compile(
        checkpointer=saver
    )


@pytest.fixture()
def roles(pg_server_dsn: str) -> Iterator[tuple[str, str, str]]:
    """(owner DSN, worker DSN, auditor DSN) on a migrated database."""
    owner = create_database(pg_server_dsn, prefix="lgd_roles")
    suffix = uuid.uuid4().hex[:8]
    names = {"app": f"app_{suffix}", "auditor": f"auditor_{suffix}"}
    grants = re.sub(r"\b(app|auditor)\b", lambda m: names[m.group(1)], _grants())
    with DeterministicSaver(owner) as saver:
        saver.setup()
    try:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(grants)
        yield (
            owner,
            make_conninfo(owner, user=names["app"], password="app-secret"),
            make_conninfo(owner, user=names["auditor"], password="auditor-secret"),
        )
    finally:
        with psycopg.connect(owner, autocommit=True) as conn:
            for role in names.values():
                conn.execute(f"DROP OWNED BY {role}")
        drop_database(pg_server_dsn, database_name(owner))
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            for role in names.values():
                conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_each_role_does_its_work_with_the_grants_the_page_gives(
    roles: tuple[str, str, str],
) -> None:
    _owner, app, auditor = roles
    with DeterministicSaver(app) as saver:
        assert saver.setup() == []  # migrated: nothing to do, no DDL tried
        graph = _graph(saver)
        config = run_config("t", "r1")
        graph.invoke({"messages": [("user", "hi")]}, config)
        graph.invoke({"messages": [("user", "hi")]}, config)  # a retry: applied once
        assert len(graph.get_state(config).values["messages"]) == 2
        first = list(graph.get_state_history(config))[-1]
        graph.invoke(None, run_config("t", "r2", checkpoint_id=first.config["configurable"]["checkpoint_id"]))
        saver.copy_thread("t", "t-copy")
        saver.prune(["t-copy"], strategy="keep_latest")
        saver.delete_thread("t-copy")
        with pytest.raises(Boom):
            graph.invoke({"messages": [("user", "boom")]}, run_config("stuck", "s1"))
    fixed = repair(app, apply=True, idle=timedelta(0))
    assert [(t.thread_id, t.applied, t.refused) for t in fixed.threads] == [("stuck", True, None)]

    report = audit(auditor)
    assert report.threads >= 2 and not report.damaged
    with DeterministicSaver(auditor) as reader, pytest.raises(ConfigurationError, match="may not"):
        _graph(reader).invoke({"messages": [("user", "hi")]}, run_config("ro", "ro-1"))
