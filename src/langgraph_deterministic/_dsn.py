"""The one place a connection string is turned into text: every message, ``repr``, log
line and CLI line built from a DSN, or from a driver error about one, goes through here.

Nothing here raises: a DSN libpq cannot parse (an unencoded ``%``, a space, a bracket left
open) is the case where a secret is most likely to be echoed, since libpq's own message
quotes the token it choked on.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

from psycopg.conninfo import conninfo_to_dict, make_conninfo

MASK: Final = "***"
UNPARSEABLE: Final = "<unparseable connection string>"
_SECRET_KEYS: Final = ("password", "sslpassword")
# Parts of a DSN where a stray "@" means libpq cut a password that holds one.
_HOST_KEYS: Final = ("host", "hostaddr", "port")
# A password in a URI's user info (up to its last "@") or as a key=value (quoted or not),
# found by text for a DSN libpq refuses; a query parameter ?password=... too.
_URI_PASSWORD: Final = re.compile(r"://[^:/?#]*:(.*)@", re.DOTALL)
_KV_PASSWORD: Final = re.compile(
    r"\b(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s&]+)", re.IGNORECASE
)
_QUOTED: Final = re.compile(r"\"[^\"]*\"?|'[^']*'?")


def redact(dsn: str) -> str:
    """``dsn`` with its passwords masked; one libpq cannot parse is not echoed at all."""
    try:
        params = conninfo_to_dict(dsn)
        for key in _SECRET_KEYS:
            if key in params:
                params[key] = MASK
        for key in _HOST_KEYS:
            if "@" in str(params.get(key, "")):
                params[key] = MASK
        return make_conninfo("", **params)
    except Exception:  # psycopg.ProgrammingError, or anything a hostile string provokes
        return UNPARSEABLE


def secrets_of(dsn: str | None) -> list[str]:
    """Every string that may be a password of ``dsn`` (as written, percent-decoded and
    parsed), longest first, so that masking one never leaves a piece of another."""
    if not dsn:
        return []
    found: set[str] = set()
    try:
        params = conninfo_to_dict(dsn)
        found.update(str(params[k]) for k in _SECRET_KEYS if params.get(k))
    except Exception:
        pass
    try:
        for match in (*_URI_PASSWORD.finditer(dsn), *_KV_PASSWORD.finditer(dsn)):
            raw = match.group(1)
            # and its pieces: libpq cuts a password holding "@" there and calls the rest
            # part of the host (a host error then quotes it)
            found.update((raw, raw.strip("'"), unquote(raw), *raw.split("@")))
    except Exception:  # pragma: no cover - regexes on a str do not fail
        pass
    return sorted((s for s in found if len(s) >= 3), key=len, reverse=True)


def scrub(text: str, dsn: str | None = None) -> str:
    """``text`` (a driver's error message, say) with every password of ``dsn`` masked."""
    try:
        for secret in secrets_of(dsn):
            text = text.replace(secret, MASK)
        return text
    except Exception:  # pragma: no cover - str.replace does not fail
        return "<message withheld: it may hold a password>"


def masked(error: BaseException, cause: BaseException, dsn: str | None) -> BaseException:
    """``error`` (ours, raised for the driver's ``cause``), masked where its text would show
    a password of ``dsn``; then raise it ``from`` :func:`chained` so a traceback does not
    print the driver's text either."""
    text = str(error)
    clean = scrub(text, dsn)
    if clean == text and scrub(str(cause), dsn) == str(cause):
        return error
    return type(error)(clean)


def chained(cause: BaseException, dsn: str | None) -> BaseException | None:
    """The ``from`` of an error raised for ``cause``: itself, or None when its text holds a
    password of ``dsn``."""
    return cause if scrub(str(cause), dsn) == str(cause) else None


def parse_error(exc: BaseException, dsn: str | None = None) -> str:
    """Why libpq refused a connection string, without the token it quotes (which may be
    the password: ``invalid percent-encoded token: "<password>%zz"``)."""
    try:
        text = " ".join(str(exc).split())
        return scrub(_QUOTED.sub('"…"', text), dsn)
    except Exception:  # pragma: no cover
        return "libpq could not parse it"
