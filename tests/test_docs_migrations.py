"""Every snippet of docs/how-to/migrations.md runs as written, against a fresh database."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "migrations.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text("utf-8"), flags=re.DOTALL)


@pytest.fixture
def fresh(pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    dsn = create_database(pg_server_dsn, prefix="lgd_docs")
    monkeypatch.setenv("DATABASE_URL", dsn)
    yield dsn
    drop_database(pg_server_dsn, database_name(dsn))


def test_python_snippets(fresh: str, capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = _blocks("python")
    exec(compile(code, str(DOC), "exec"), {})
    assert "0001_pre_checkpoint_tables" in capsys.readouterr().out


def test_shell_snippets(fresh: str) -> None:
    (script,) = _blocks("bash")
    commands = [
        shlex.split(line, comments=True)
        for line in script.splitlines()
        if line.startswith("langgraph-deterministic")
    ]
    assert len(commands) == 4
    for argv in commands:
        assert main(argv[1:]) == 0, argv
