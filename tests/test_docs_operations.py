"""docs/how-to/operations.md as written: every synopsis runs (each placeholder filled in, each
choice tried) on a database with planted faults and gives the exit code the page says; the
``--json`` example has the keys of a real report; the fault-class tables name exactly the
classes audit knows; the defaults the page quotes are the CLI's."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from benchmarks import fault_db

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic.cli import main
from langgraph_deterministic.ops import DEFAULT_IDLE, STATEMENT_TIMEOUT_MS
from langgraph_deterministic.ops.audit import (
    AUDIT_WORK_MEM,
    AUTO_BUSY_WAL_BYTES_PER_S,
    AUTO_DUTY,
    DEFAULT_BATCH_ROWS,
    FAULTS,
    RANGE_TARGET_S,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "operations.md"
TEXT = DOC.read_text("utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", TEXT, flags=re.DOTALL)


def _synopses() -> dict[str, list[str]]:
    """{subcommand: synopsis words after it} from the page's bash block."""
    (script,) = _blocks("bash")
    out = {}
    for line in script.splitlines():
        words = shlex.split(line)
        assert words[0] == "langgraph-deterministic", line
        out[words[1]] = words[2:]
    return out


def _inline_commands() -> list[str]:
    """Commands the prose quotes inline (`langgraph-deterministic ...`)."""
    return re.findall(r"`(langgraph-deterministic [^`]+)`", " ".join(TEXT.split()))


def _expand(words: list[str], values: dict[str, str]) -> list[list[str]]:
    """Every option of a synopsis present, placeholders filled from ``values``; an option
    with choices (``pre|post|all``) gives one command line per choice."""
    options = re.findall(r"\[([^\]]+)\]", " ".join(words))
    assert options and " ".join(f"[{o}]" for o in options) == " ".join(words), words
    lines: list[list[str]] = [[]]
    for option in options:
        flag, *arg = option.split()
        if not arg:
            lines = [[*line, flag] for line in lines]
        elif "|" in arg[0]:
            lines = [[*line, flag, choice] for line in lines for choice in arg[0].split("|")]
        else:
            lines = [[*line, flag, values[arg[0]]] for line in lines]
    return lines


@pytest.fixture
def planted(
    pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A PostgresSaver-only database (no tables of ours yet) with every fault planted."""
    dsn = create_database(pg_server_dsn, prefix="lgd_docs_ops")
    monkeypatch.setenv("DATABASE_URL", dsn)
    try:
        yield dsn, fault_db.build(dsn, threads=40, planted=1, runs=2, ledger=False)
    finally:
        drop_database(pg_server_dsn, database_name(dsn))


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_every_synopsis_runs_with_the_exit_codes_the_page_gives(
    planted: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, expected = planted
    synopses = _synopses()
    assert set(synopses) == {"audit", "repair", "migrate", "uninstall"}
    fork = next(t for t, e in expected.items() if "forked_history" in e)
    values = {"DSN": dsn, "ID": fork, "TIME": "2026-10-01T00:00"}  # before every head

    # audit: 1 when it found damage; the bare form reads $DATABASE_URL
    assert main(["audit"]) == 1
    (full,) = _expand(synopses["audit"], values)
    code, report = _json(capsys, ["audit", *full])
    assert code == 1 and [t["thread_id"] for t in report["damaged_threads"]] == [fork]
    # every form of TIME the page names parses (a later TIME just narrows the scan)
    for when in ("2026-11-30T08:00", "30m", "6h", "2d"):
        assert main(["audit", "--since", when]) in (0, 1), when

    # the options the prose names, with the values it gives
    assert main(["audit", "--idle", "600", "--pause", "0.3", "--thread", fork]) == 1

    # repair: a dry run exits 1 when there is something to repair and writes nothing
    (repair_line,) = _expand(synopses["repair"], values)
    dry = [w for w in repair_line if w != "--apply"]
    assert main(["repair", *dry]) == 1
    assert main(["audit"]) == 1

    # migrate: a dry run of each phase changes nothing (post refuses before pre, naming
    # it); then the command the page says `repair --apply` needs first
    lines = {line[line.index("--phase") + 1]: line for line in _expand(synopses["migrate"], values)}
    assert sorted(lines) == ["all", "post", "pre"]
    assert main(["migrate", *lines["pre"]]) == 0
    assert main(["migrate", *lines["all"]]) == 0
    capsys.readouterr()
    assert main(["migrate", *lines["post"]]) == 2
    assert "langgraph-deterministic migrate --phase pre" in capsys.readouterr().err
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('lgd_repairs')").fetchone() == (None,)
    assert _inline_commands() == ["langgraph-deterministic migrate --phase pre"]
    for command in _inline_commands():
        assert main(shlex.split(command)[1:]) == 0, command
    assert main(["migrate", *lines["post"]]) == 0

    # repair --apply: 0 when every damaged thread was repaired; audit is clean after
    code, done = _json(capsys, ["repair", *repair_line, "--json"])
    assert code == 0, done
    repaired = [t for t in done["threads"] if t["applied"]]
    assert repaired and all(
        t["backup_thread_id"] == f"lgd-backup:{t['repair_id']}:{t['thread_id']}" for t in repaired
    )
    assert main(["audit"]) == 0  # the backups (damaged copies) are skipped, as the page says
    assert main(["repair"]) == 0  # nothing left to repair

    # uninstall: the dry run prints the statements and changes nothing; then it removes
    # our tables, and the database is PostgresSaver's again (audit still reads it)
    (uninstall_line,) = _expand(synopses["uninstall"], values)
    capsys.readouterr()
    assert main(["uninstall", *uninstall_line]) == 0
    assert "DROP TABLE IF EXISTS" in capsys.readouterr().out
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('lgd_repairs') IS NOT NULL").fetchone() == (True,)
    assert main(["uninstall"]) == 0
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('lgd_repairs')").fetchone() == (None,)
    assert main(["audit"]) == 0


def test_audit_exit_code_two_on_connection_and_usage_errors() -> None:
    assert main(["audit", "--dsn", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    assert main(["audit", "--since", "yesterday"]) == 2


def _json_example() -> dict[str, Any]:
    (example,) = _blocks("json")
    # the page elides with `...`: drop the elisions to get the JSON they abbreviate
    valid = re.sub(r",\s*\.\.\.\s*}", "}", example).replace("[...]", "[]")
    return dict(json.loads(valid))


def test_json_example_has_the_shape_of_a_real_report(
    planted: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    example = _json_example()
    _code, real = _json(capsys, ["audit", "--json"])
    assert set(example) == set(real)
    for key, value in example.items():
        assert type(value) is type(real[key]), key
    assert set(example["counts"]) <= set(FAULTS) and set(real["counts"]) <= set(FAULTS)
    (thread,) = example["damaged_threads"]
    assert set(thread) == set(real["damaged_threads"][0])
    (finding,) = thread["findings"]
    assert set(finding) == set(real["damaged_threads"][0]["findings"][0])
    assert set(thread["faults"]) <= set(FAULTS) and finding["severity"] == "damage"
    assert example["clean"] is False and real["clean"] is False


def _table_first_column(heading: str) -> list[str]:
    """The backquoted names in the first column of the first table after ``heading``."""
    section = TEXT[TEXT.index(heading) :]
    rows = re.findall(r"^\|([^|]*)\|", section[section.index("\n|") :], flags=re.M)
    names: list[str] = []
    for cell in rows:
        if cell.strip() and set(cell.strip()) <= set("-"):
            continue
        if not cell.strip().startswith("`"):
            if names:
                break  # the table ended
            continue  # its header row
        names += re.findall(r"`([a-z_]+)`", cell)
    return names


def test_fault_tables_name_the_classes_audit_knows() -> None:
    audit_classes = _table_first_column("## audit:")
    assert sorted(audit_classes) == sorted(FAULTS)
    for name in audit_classes:
        row = next(ln for ln in TEXT.splitlines() if ln.startswith(f"| `{name}` |"))
        severity = row.rsplit("|", 2)[-2].strip()
        assert severity == ("risk (not damage)" if FAULTS[name].severity == "risk" else "damage")
    assert sorted(_table_first_column("## repair:")) == sorted(FAULTS)


def test_quoted_defaults_are_the_cli_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    flat = " ".join(TEXT.split())
    assert f"(`--statement-timeout`, default {STATEMENT_TIMEOUT_MS} ms)" in flat
    assert f"(default {int(DEFAULT_IDLE.total_seconds())})" in flat
    assert f"up to {DEFAULT_BATCH_ROWS:,} checkpoints" in flat
    assert f"run about {RANGE_TARGET_S * 1000:g} ms" in flat
    assert f"`work_mem` {AUDIT_WORK_MEM}" in flat
    assert f"faster than {AUTO_BUSY_WAL_BYTES_PER_S // 1024} KiB/s" in flat
    assert AUTO_DUTY == 0.25 and "three times as long as the range took" in flat
    assert "at most a quarter of the time" in flat
    assert f"`--duty SHARE` (default {AUTO_DUTY:g})" in flat
    assert "By default (`--priority normal`) the audit leaves the scheduling" in flat
    assert main(["audit", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default {STATEMENT_TIMEOUT_MS})" in help_text
    assert f"(default {AUTO_DUTY:g};" in help_text
    assert f"(default {int(DEFAULT_IDLE.total_seconds())})" in help_text
    assert "normal (default): leave every process's scheduling as it is" in help_text
