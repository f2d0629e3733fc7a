"""``migrations/schema.sql`` is the schema the migrations build, and the SQL speaks the
Python side's vocabulary: every LG4xx code it raises and every run status it writes is one
``contract`` defines (the SQL spells the literals; nothing else keeps them in step).

The schema check applies every migration to one empty database and ``schema.sql`` to
another, on the same server, and compares their catalogs: tables and columns (in order,
with types, NOT NULL and defaults, TOAST compression), constraints, indexes (with their
definitions and validity), sequences, and functions (arguments, result, language,
volatility, cost, and the body with comments and whitespace normalised), plus the
recorded migration versions. Functions that schema.sql lists as legacy (kept by the
migrations for older workers) are the only allowed difference.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import psycopg
import pytest

from devtools.postgres import create_database, database_name, drop_database
from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.checkpointer import contract
from langgraph_deterministic.runner._postgres import SQLSTATE_LOST

#: every LG-class SQLSTATE Python translates: the contract's and the journal's
KNOWN_CODES = contract.SQLSTATES | {SQLSTATE_LOST}

PACKAGE = Path(str(resources.files("langgraph_deterministic")))
MIGRATIONS = PACKAGE / "migrations"
SCHEMA = MIGRATIONS / "schema.sql"

_CATALOG = {
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attcompression::text
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
          AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = 'public'::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE c.relnamespace = 'public'::regnamespace
        ORDER BY 1""",
    "sequences": """
        SELECT c.relname, s.seqtypid::regtype::text, s.seqstart, s.seqincrement
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        WHERE c.relnamespace = 'public'::regnamespace
        ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_function_result(p.oid), l.lanname, p.provolatile, p.procost::int,
               p.prosrc
        FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
        WHERE p.pronamespace = 'public'::regnamespace
        ORDER BY 1, 2""",
    "versions": """
        SELECT version, name, phase FROM langgraph_deterministic_migrations ORDER BY 1""",
    "peer_versions": "SELECT v FROM checkpoint_migrations ORDER BY 1",
}


def _normalise_body(body: str) -> str:
    """A function body without comments and with whitespace collapsed."""
    body = re.sub(r"--[^\n]*", "", body)
    return " ".join(body.split())


def _catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    found: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, sql in _CATALOG.items():
            rows = [tuple(r) for r in conn.execute(sql).fetchall()]
            if name == "functions":
                rows = [(*r[:-1], _normalise_body(r[-1])) for r in rows]
            found[name] = rows
    return found


def _legacy_functions() -> set[str]:
    text = SCHEMA.read_text("utf-8")
    names: set[str] = set()
    for line in re.findall(r"(?m)^--\s+legacy:(.*)$", text):
        names.update(n.strip() for n in line.split(",") if n.strip())
    return names


@pytest.fixture(scope="module")
def databases(pg_server_dsn: str) -> Iterator[tuple[str, str]]:
    migrated = create_database(pg_server_dsn, prefix="lgd_schema_migrated")
    fresh = create_database(pg_server_dsn, prefix="lgd_schema_fresh")
    try:
        with DeterministicSaver(migrated) as saver:
            saver.setup()
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute(SCHEMA.read_text("utf-8").encode("utf-8"))  # one implicit transaction
        yield migrated, fresh
    finally:
        drop_database(pg_server_dsn, database_name(migrated))
        drop_database(pg_server_dsn, database_name(fresh))


def test_migrations_reproduce_schema_sql(databases: tuple[str, str]) -> None:
    migrated, fresh = _catalog(databases[0]), _catalog(databases[1])
    legacy = _legacy_functions()
    assert legacy, "schema.sql lists no legacy functions: the parser is broken"
    kept = {r[0] for r in migrated["functions"]}
    assert legacy <= kept, f"listed as legacy but no migration creates them: {legacy - kept}"
    migrated["functions"] = [r for r in migrated["functions"] if r[0] not in legacy]
    for part in _CATALOG:
        only_migrated = sorted(set(migrated[part]) - set(fresh[part]), key=repr)
        only_schema = sorted(set(fresh[part]) - set(migrated[part]), key=repr)
        assert migrated[part] == fresh[part], (
            f"{part}: migrations and schema.sql differ. Only after the migrations: "
            f"{only_migrated}; only from schema.sql: {only_schema}. A new migration must "
            "change migrations/schema.sql the same way."
        )


def test_setup_on_a_schema_sql_database_has_nothing_to_do(databases: tuple[str, str]) -> None:
    with DeterministicSaver(databases[1]) as saver:
        assert saver.setup(dry_run=True) == []


# --- the vocabulary the SQL shares with Python --------------------------------------------


def _sql_files() -> list[Path]:
    files = sorted(MIGRATIONS.glob("*.sql"))
    files += sorted((PACKAGE / "checkpointer" / "sql").glob("*.sql"))
    files += sorted((PACKAGE / "ops" / "sql").glob("*.sql"))
    return files


def _strip_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def _literals(fragment: str) -> list[str]:
    return re.findall(r"'([^']*)'", fragment)


def run_statuses_in(text: str) -> set[str]:
    """Status literals the SQL writes into or compares with lgd_runs.status: in every
    statement (split on ';') that names lgd_runs, the literals in `status = ...`,
    `status <> ...`, `status IN (...)`, `status = CASE ... END` and the status column of
    an INSERT INTO lgd_runs."""
    found: set[str] = set()
    for statement in _strip_comments(text).split(";"):
        if "lgd_runs" not in statement:
            continue
        col = r"\b(?:\w+\.)?status\b"
        for m in re.finditer(col + r"\s*(?:=|<>|!=)\s*'([^']*)'", statement):
            found.add(m.group(1))
        for m in re.finditer(col + r"\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", statement, re.I):
            found.update(_literals(m.group(1)))
        for m in re.finditer(col + r"\s*=\s*CASE\b(.*?)\bEND\b", statement, re.I | re.S):
            found.update(re.findall(r"\b(?:THEN|ELSE)\s+'([^']*)'", m.group(1), re.I))
        insert = re.search(
            r"INSERT\s+INTO\s+lgd_runs(?:\s+AS\s+\w+)?\s*\(([^)]*)\)\s*(?:VALUES\s*\(|SELECT\s)(.*)",
            statement,
            re.I | re.S,
        )
        if insert:
            columns = [c.strip() for c in insert.group(1).split(",")]
            values = [v.strip().rstrip(")").strip() for v in insert.group(2).split(",")]
            if "status" in columns:
                value = values[columns.index("status")]
                assert re.fullmatch(r"'[a-z_]+'", value), (
                    f"INSERT INTO lgd_runs writes status {value!r}: not a literal the test "
                    "can check"
                )
                found.add(value.strip("'"))
    return found


def error_codes_in(text: str) -> set[str]:
    """Every LG-class SQLSTATE literal: ERRCODE = 'LG4xx' and codes passed as arguments."""
    return set(re.findall(r"'(LG\d{3})'", _strip_comments(text)))


def test_every_error_code_the_sql_raises_is_known_to_python() -> None:
    raised: dict[str, set[str]] = {}
    for path in _sql_files():
        for code in error_codes_in(path.read_text("utf-8")):
            raised.setdefault(code, set()).add(path.name)
    unknown = {c: sorted(f) for c, f in raised.items() if c not in KNOWN_CODES}
    assert not unknown, f"SQL raises codes Python does not define: {unknown}"
    assert set(raised) >= KNOWN_CODES, "a code Python translates is never raised"
    current = error_codes_in((MIGRATIONS / "0016_pre_arbitration_v6.sql").read_text("utf-8"))
    current |= error_codes_in((MIGRATIONS / "0025_pre_lost_writes.sql").read_text("utf-8"))
    assert current == contract.SQLSTATES, "every code Python translates is raised by current SQL"


def test_every_run_status_the_sql_writes_is_known_to_python() -> None:
    used: dict[str, set[str]] = {}
    for path in _sql_files():
        for status in run_statuses_in(path.read_text("utf-8")):
            used.setdefault(status, set()).add(path.name)
    unknown = {s: sorted(f) for s, f in used.items() if s not in contract.RUN_STATUSES}
    assert not unknown, f"SQL uses run statuses contract.RUN_STATUSES lacks: {unknown}"
    assert set(contract.RUN_STATUSES) <= set(used), "a status Python knows is never written"
    assert set(get_args(contract.Closing)) <= set(contract.RUN_STATUSES)


def test_the_status_parser_sees_what_it_must() -> None:
    """The parser itself: the forms the SQL uses, and one it must not take for a status."""
    sql = """
        UPDATE lgd_runs SET status = 'a', x = 1 WHERE status IN ('b', 'c');
        UPDATE lgd_runs r SET status = CASE WHEN y THEN 'd' ELSE 'e' END;
        INSERT INTO lgd_runs AS r (thread_id, status) VALUES (p_thread, 'f');
        UPDATE lgd_journal SET status = 'not_a_run_status';
    """
    assert run_statuses_in(sql) == {"a", "b", "c", "d", "e", "f"}
    assert error_codes_in("RAISE USING ERRCODE = 'LG499'; -- 'LG498'") == {"LG499"}
