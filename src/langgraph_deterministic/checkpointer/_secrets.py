"""Which metadata a checkpoint row keeps: an allow-list of configurable keys, and no
entry that looks like a credential by its key or its value."""

from __future__ import annotations

import re
from typing import Any

#: except keys whose names look like secrets.
DEFAULT_METADATA_KEYS: frozenset[str] = frozenset({"run_id", "assistant_id", "graph_id"})
# A metadata key is secret-looking when it contains one of these (so `apikey`, `x-api-key`,
# `AuthorizationHeader` and `bearer_token` are caught, at the price of a `monkey`)...
_SECRET_SUBSTRINGS = (
    "key", "token", "secret", "passw", "passphrase", "auth", "bearer", "credential",
    "cookie", "private", "signature", "jwt", "session",
)  # fmt: skip
# ...or has one of these short words as a word of its own (`db_pwd`, `userPass`, `creds`).
_SECRET_WORDS = frozenset({"pwd", "pw", "pass", "pin", "otp", "cred", "creds", "dsn", "sig"})
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
# A value that is a credential whatever its key: an Authorization header, a JWT, a URL or
# DSN carrying a password, or a well-known API key shape.
_SECRET_VALUE = re.compile(
    r"^\s*(bearer|basic|token|digest)\s+\S"
    r"|^eyJ[\w-]*\.[\w-]+\.[\w-]*$"
    r"|://[^/\s:@]*:[^/\s@]+@"
    r"|\bpassword\s*="
    r"|^(sk|rk|pk)[-_](live[-_]|test[-_]|proj[-_]|ant[-_])?[A-Za-z0-9_-]{16,}"
    r"|^(ghp|gho|ghs|ghu|github_pat|glpat|xox[abposr])[-_][A-Za-z0-9_-]{10,}"
    r"|^(AKIA|ASIA)[0-9A-Z]{16}$|^AIza[0-9A-Za-z_-]{30,}$",
    re.IGNORECASE,
)


def looks_secret(key: str, value: Any = None) -> bool:
    """Whether a metadata entry may hold a credential, by its key or by its value. Errs
    on the side of dropping: a dropped entry is a missing filter, a kept one a leak."""
    lowered = key.casefold()
    if any(part in lowered for part in _SECRET_SUBSTRINGS):
        return True
    if any(word.casefold() in _SECRET_WORDS for word in _WORD.findall(key)):
        return True
    return isinstance(value, str) and _SECRET_VALUE.search(value) is not None
