"""Why a connection failed, said for what the user passed: the CLI checks a DSN once with
:func:`check` before a command uses it, so a wrong password reads as a wrong password."""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg.conninfo import conninfo_to_dict

from langgraph_deterministic._dsn import chained, parse_error, redact, scrub
from langgraph_deterministic.errors import (
    ConfigurationError,
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


__all__ = ["check", "explain", "parse", "redact"]


def explain(exc: psycopg.OperationalError, dsn: str, source: str) -> DeterministicError:
    """The error to raise for a failed connection to ``dsn`` (taken from ``source``:
    ``--dsn`` or ``$DATABASE_URL``), naming the cause and the fix for it."""
    text = scrub(" ".join(str(exc).split()), dsn)
    where = f"{redact(dsn)} (from {source})"
    state = getattr(exc, "sqlstate", None)
    if state in ("28P01", "28000") or any(a in text for a in _AUTH):
        return ConfigurationError(
            f"authentication failed for {where}: {text}. Fix: correct the user name or "
            f"password in {source} (the server refused this login)."
        )
    if state == "3D000" or ('database "' in text and "does not exist" in text):
        return ConfigurationError(
            f"the database named in {where} does not exist: {text}. Fix: create it "
            f"(createdb) or name an existing one in {source}."
        )
    return DatabaseUnavailableError(
        f"cannot connect to Postgres at {where}: {text}. Fix: check that the server runs "
        f"and accepts connections at that host and port, or correct {source}."
    )


def check(dsn: str, source: str, *, timeout_s: int = 10) -> None:
    """Connect once to ``dsn``; raise :func:`explain`'s error when that fails."""
    parse(dsn, source)
    try:
        with psycopg.connect(dsn, connect_timeout=timeout_s, autocommit=True):
            pass
    except psycopg.OperationalError as exc:
        raise explain(exc, dsn, source) from chained(exc, dsn)


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
