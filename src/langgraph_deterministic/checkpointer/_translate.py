"""psycopg errors mapped to ours, where we can name the fix."""

from __future__ import annotations

import psycopg
import psycopg.errors

from langgraph_deterministic._dsn import parse_error
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    SchemaNotReadyError,
)

# SQLSTATE classes of a failure to reach or log in to the server. Other operational errors
# (deadlocks, serialization failures, cancellations) are not about reachability and keep
# their own type, so callers can retry them.
_CONNECTION_SQLSTATES = ("08", "28", "3D000", "57P01", "57P02", "57P03")


def _is_connection_failure(exc: psycopg.OperationalError) -> bool:
    state = exc.sqlstate
    return state is None or state.startswith(_CONNECTION_SQLSTATES)


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
        return ConfigurationError(
            f"The database role this saver connects as may not do this "
            f"({exc.diag.message_primary}). Workers need DML on every table (the checkpoint "
            "tables and the lgd_* ones) and USAGE on the sequences; as the tables' owner: "
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO <role>; "
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO <role> (see "
            "docs/how-to/adopting.md, Requirements). The statement was rolled back."
        )
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        # A standby (in recovery), or a primary being demoted: writes come back once the
        # connection reaches the primary again.
        return DatabaseUnavailableError(
            f"Postgres refused the write: {str(exc).strip()}. This connection reached a "
            "server that does not take writes now (a standby, a server in recovery, or "
            "one with default_transaction_read_only). Nothing was written. Give the DSN "
            "target_session_attrs=read-write (with every host of the cluster) so new "
            "connections go to the primary, and retry with the same run id."
        )
    if isinstance(exc, psycopg.OperationalError) and _is_connection_failure(exc):
        # The server's (or the pooler's) own reason is in the message: keep it whole.
        reason = str(exc).strip()
        if "authentication failed" in reason or (exc.sqlstate or "").startswith("28"):
            return DatabaseUnavailableError(
                f"Postgres refused the login: {reason}. Check the user and password in the "
                "DSN (and the pooler's userlist, behind PgBouncer)."
            )
        return DatabaseUnavailableError(
            f"Could not reach Postgres: {reason}. Check that the server is "
            "running and that the DSN (host, port, user, password, dbname) is right."
        )
    if isinstance(exc, psycopg.ProgrammingError) and "conninfo" in str(exc).lower():
        return ConfigurationError(
            f"The connection string is not valid: {parse_error(exc)}. Pass a libpq URI such as "
            "'postgresql://user:password@host:5432/dbname' or a 'key=value' string."
        )
    return exc
