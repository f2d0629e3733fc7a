"""psycopg errors mapped to ours, where we can name the fix."""

from __future__ import annotations

import re

import psycopg
import psycopg.errors
import psycopg_pool

from langgraph_deterministic._dsn import parse_error
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseAccessError,
    DatabaseUnavailableError,
    DeterministicError,
    SchemaNotReadyError,
)

# Why a connection failed, by the server's SQLSTATE: whether a retry can get past it
# (the server comes back, a slot frees up, a failover ends) or not (the DSN or a grant is
# wrong, and stays wrong). docs/reference/errors.md tabulates this; tests/checkpointer/
# test_connection_errors.py checks every row against translate_error.
#: SQLSTATE -> (condition name, whether a retry can succeed)
CONNECTION_SQLSTATES: dict[str, tuple[str, bool]] = {
    "08000": ("connection_exception", True),
    "08001": ("sqlclient_unable_to_establish_sqlconnection", True),
    "08003": ("connection_does_not_exist", True),
    "08004": ("sqlserver_rejected_establishment_of_sqlconnection", True),
    "08006": ("connection_failure", True),
    "08007": ("transaction_resolution_unknown", True),
    "08P01": ("protocol_violation (PgBouncer's errors, save the ones below)", True),
    "25006": ("read_only_sql_transaction (a standby)", True),
    "53300": ("too_many_connections", True),
    "57P01": ("admin_shutdown", True),
    "57P02": ("crash_shutdown", True),
    "57P03": ("cannot_connect_now (starting up, shutting down, in recovery)", True),
    "3D000": ("invalid_catalog_name (no such database)", False),
    "28000": ("invalid_authorization_specification (no such role, no pg_hba.conf entry)", False),
    "28P01": ("invalid_password (authentication failed)", False),
    "42501": ("insufficient_privilege (no CONNECT on the database, no grant on a table)", False),
}

# A failed login reaches psycopg as the server's text only (no SQLSTATE): the permanent
# causes are told apart by the server's (or PgBouncer's) own words. Anything else that
# fails to connect reads as unreachable, which a retry can get past.
_PERMANENT_TEXT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'database "[^"]*" does not exist|no such database'), "3D000"),
    (re.compile(r"authentication failed|no password supplied|password is required"), "28P01"),
    (re.compile(r'role "[^"]*" does not exist|no such user'), "28000"),
    (re.compile(r'role "[^"]*" is not permitted to log in'), "28000"),
    (re.compile(r"no pg_hba\.conf entry"), "28000"),
    (re.compile(r"permission denied for database"), "42501"),
)


def connection_sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE a connection failure stands for (from the server's, or read from its
    message when psycopg has none), ``""`` for a failure to connect without one
    (refused, timed out, a pool with no connection free), None for no connection failure."""
    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    if state is not None:
        return state if state in CONNECTION_SQLSTATES else None
    if not isinstance(exc, psycopg.OperationalError):
        return None
    text = str(exc)
    for pattern, found in _PERMANENT_TEXT:
        if pattern.search(text):
            return found
    return ""


def sentence(text: str) -> str:
    """The server's message on one line, ending in one full stop."""
    text = " ".join(str(text).split())
    return text if text.endswith((".", "?", "!")) else text + "."


def _access_error(state: str, reason: str) -> DatabaseAccessError:
    if state == "3D000":
        return DatabaseAccessError(
            f"Postgres has no database of the name the DSN gives: {reason} A retry cannot "
            "succeed. Fix: create it (`createdb <name>`, or CREATE DATABASE <name> as a "
            "role that may) or correct the DSN's dbname, then run `saver.setup()` once."
        )
    if state == "42501":
        return DatabaseAccessError(
            f"Postgres refused this role the database: {reason} A retry cannot succeed. "
            "Fix: as the database's owner, GRANT CONNECT ON DATABASE <name> TO <role>, or "
            "connect as a role that has it."
        )
    if "pg_hba" in reason:
        return DatabaseAccessError(
            f"Postgres has no rule that lets this login in: {reason} A retry cannot "
            "succeed. Fix: add a pg_hba.conf line for this user, database and host (then "
            "SELECT pg_reload_conf()), or connect as a user a line allows."
        )
    if "does not exist" in reason or "no such user" in reason or "not permitted" in reason:
        return DatabaseAccessError(
            f"Postgres refused the login: {reason} A retry cannot succeed. Fix: correct "
            "the DSN's user, or create the role (CREATE ROLE <name> LOGIN PASSWORD '...') "
            "or give it LOGIN (ALTER ROLE <name> LOGIN)."
        )
    return DatabaseAccessError(
        f"Postgres refused the login: {reason} A retry cannot succeed. Fix: correct the "
        "user and password in the DSN (and the pooler's userlist, behind PgBouncer)."
    )


def translate_error(exc: BaseException) -> BaseException:
    """Map a psycopg error to ours where we can name the fix; else return it unchanged."""
    if isinstance(exc, DeterministicError):
        return exc
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        return SchemaNotReadyError(
            f"The checkpoint tables are missing or out of date ({exc.diag.message_primary}). "
            "Run `saver.setup()` (or `await saver.asetup()`, or the CLI "
            "`langgraph-deterministic migrate`) once against this database before use."
        )
    if isinstance(exc, psycopg.errors.UndefinedFunction) and "lgd_" in (
        exc.diag.message_primary or ""
    ):
        # Our versioned functions (lgd_..._vN): the database predates this version of the
        # package (setup() never ran, or a rolling deploy started these workers before
        # its pre-migrations).
        return SchemaNotReadyError(
            f"This database lacks a function this version of langgraph-deterministic calls "
            f"({exc.diag.message_primary}): its migrations have not run here yet. Run "
            "`saver.setup()` (or `await saver.asetup()`), or, beside live workers of an "
            "older version, `langgraph-deterministic migrate --phase pre`, then retry with "
            "the same run id: the statement that called it was rolled back, and what the "
            "run committed before it (on a database migrated part-way) is continued, not "
            "applied twice."
        )
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return DatabaseAccessError(
            f"The database role connected as may not do this "
            f"({exc.diag.message_primary or ' '.join(str(exc).split())}). A retry cannot "
            "succeed. Fix: workers need DML on every table (the checkpoint "
            "tables and the lgd_* ones) and USAGE on the sequences; as the tables' owner: "
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO <role>; "
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO <role> (see "
            "docs/how-to/adopting.md, Requirements). The statement was rolled back."
        )
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        # A standby (in recovery), or a primary being demoted: writes come back once the
        # connection reaches the primary again.
        return DatabaseUnavailableError(
            f"Postgres refused the write: {sentence(str(exc))} This connection reached a "
            "server that does not take writes now (a standby, a server in recovery, or "
            "one with default_transaction_read_only). Nothing was written. Give the DSN "
            "target_session_attrs=read-write (with every host of the cluster) so new "
            "connections go to the primary, and retry with the same run id."
        )
    state = connection_sqlstate(exc)
    if state is not None:
        # The server's (or the pooler's) own reason is in the message: keep it whole.
        reason = sentence(str(exc))
        if state and not CONNECTION_SQLSTATES[state][1]:
            return _access_error(state, reason)
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return DatabaseUnavailableError(
                f"No pooled connection came free in time: {reason} Every connection of "
                "the pool was in use (raise its max_size, or shorten what holds them), or "
                "it could not connect (psycopg_pool's log names why); a retry with the "
                "same run id succeeds once one is free."
            )
        return DatabaseUnavailableError(
            f"Could not reach Postgres: {reason} Check that the server is running and "
            "that the DSN's host and port are right; a retry with the same run id "
            "succeeds once it is reachable."
        )
    if isinstance(exc, psycopg.ProgrammingError) and "conninfo" in str(exc).lower():
        return ConfigurationError(
            f"The connection string is not valid: {sentence(parse_error(exc))} Pass a libpq URI such as "
            "'postgresql://user:password@host:5432/dbname' or a 'key=value' string."
        )
    return exc
