"""Why a connection failed, said for what the user passed: the CLI checks a DSN once with
:func:`check` before a command uses it, so a wrong password reads as a wrong password."""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict

from langgraph_deterministic._dsn import chained, parse_error, redact, scrub
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseAccessError,
    DatabaseUnavailableError,
    DeterministicError,
)

# libpq's wording (the server's FATAL, or the client's own) for a refused login
_AUTH: Final = (
    "authentication failed",
    "no password supplied",
    "pg_hba.conf",
    'role "',  # role "x" does not exist
    "password is required",
)


__all__ = ["check", "connect", "explain", "parse", "redact"]


def _ends(text: str) -> str:
    """``text`` ending in one full stop (a libpq hint ends in "?")."""
    return text if text.endswith((".", "?", "!")) else text + "."


def explain(exc: psycopg.OperationalError, dsn: str, source: str) -> DeterministicError:
    """The error to raise for a failed connection to ``dsn`` (taken from ``source``:
    ``--dsn`` or ``$DATABASE_URL``), naming the cause and the fix for it."""
    text = scrub(" ".join(str(exc).split()), dsn).rstrip(".")
    where = f"{redact(dsn)} (from {source})"
    state = getattr(exc, "sqlstate", None)
    if state in ("28P01", "28000") or any(a in text for a in _AUTH):
        return DatabaseAccessError(
            f"authentication failed for {where}: {_ends(text)} Fix: correct the user name or "
            f"password in {source} (the server refused this login)."
        )
    if state == "3D000" or ('database "' in text and "does not exist" in text):
        return DatabaseAccessError(
            f"the database named in {where} does not exist: {_ends(text)} Fix: create it "
            f"(createdb) or name an existing one in {source}."
        )
    if state == "42501" or "permission denied for database" in text:
        return DatabaseAccessError(
            f"the role named in {where} may not connect to that database: {_ends(text)} Fix: as "
            "the database's owner, GRANT CONNECT ON DATABASE <name> TO <role>, or name a "
            f"role that has it in {source}."
        )
    return DatabaseUnavailableError(
        f"cannot connect to Postgres at {where}: {_ends(text)} Fix: check that the server runs "
        f"and accepts connections at that host and port, or correct {source}."
    )


def connect(
    dsn: str,
    *,
    source: str = "the DSN",
    application_name: str = "langgraph-deterministic ops",
    options: str | None = None,
    timeout_s: int = 10,
) -> psycopg.Connection[Any]:
    """The one way ops connects: an autocommit connection to ``dsn`` (taken from
    ``source``), or :func:`explain`'s error naming the cause and the fix."""
    parse(dsn, source)
    try:
        return psycopg.connect(  # a None option is left out of the connection string
            dsn, autocommit=True, connect_timeout=timeout_s,
            application_name=application_name, options=options,
        )  # fmt: skip
    except psycopg.OperationalError as exc:
        raise explain(exc, dsn, source) from chained(exc, dsn)


def check(dsn: str, source: str, *, timeout_s: int = 10) -> None:
    """Connect once to ``dsn``; raise :func:`explain`'s error when that fails."""
    with connect(dsn, source=source, timeout_s=timeout_s):
        pass


def parse(dsn: str, source: str) -> None:
    """Raise our error (the password not echoed) when libpq cannot parse ``dsn``."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"{source} is not a valid libpq connection string ({parse_error(exc, dsn)}). "
            "Fix: use the form "
            "postgresql://user:password@host:5432/dbname."
        ) from None
