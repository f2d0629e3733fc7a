"""Operations on a deployment's checkpoint database: find what retries broke, and fix it.

* :func:`~langgraph_deterministic.ops.audit.audit`: a read-only scan, safe beside live
  workers (``langgraph-deterministic audit``).
* :func:`~langgraph_deterministic.ops.repair.repair`: a fix per fault class, dry-run by
  default (``langgraph-deterministic repair``).

Both read the tables of langgraph-checkpoint-postgres, with or without ours. See
docs/operations.md.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from importlib import resources
from typing import Final

DEFAULT_IDLE: Final = timedelta(minutes=10)
"""How long a thread with a step left must be quiet to count as stuck, not running."""
STATEMENT_TIMEOUT_MS: Final = 5_000
"""The audit's per-statement limit; a range of threads slower than this is split."""


@cache
def queries(name: str) -> dict[str, str]:
    """The ``-- name: key`` blocks of ``ops/sql/<name>.sql``."""
    text = resources.files(__package__).joinpath(f"sql/{name}.sql").read_text("utf-8")
    blocks: dict[str, str] = {}
    key: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if key:
                blocks[key] = "\n".join(lines).strip()
            key, lines = line.split(":", 1)[1].strip(), []
        elif key is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    if key:
        blocks[key] = "\n".join(lines).strip()
    return blocks
