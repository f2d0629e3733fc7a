"""Operations on a deployment's checkpoint database: find what retries broke, and fix it.

* :func:`~langgraph_deterministic.ops.audit.audit`: a read-only scan, safe beside live
  workers (``langgraph-deterministic audit``).
* :func:`~langgraph_deterministic.ops.repair.repair`: a fix per fault class, dry-run by
  default (``langgraph-deterministic repair``).
* :func:`~langgraph_deterministic.ops.uninstall.uninstall`: remove every object our
  migrations added, back to PostgresSaver (``langgraph-deterministic uninstall``).

Both read the tables of langgraph-checkpoint-postgres, with or without ours. See
docs/how-to/operations.md.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from importlib import resources
from typing import Final

from langgraph_deterministic._db.queries import named_blocks

DEFAULT_IDLE: Final = timedelta(minutes=10)
"""How long a thread with a step left must be quiet to count as stuck, not running."""
STATEMENT_TIMEOUT_MS: Final = 5_000
"""The audit's per-statement limit; a range of threads slower than this is split."""


@cache
def queries(name: str) -> dict[str, str]:
    """The ``-- name: key`` blocks of ``ops/sql/<name>.sql``."""
    return named_blocks(
        resources.files(__package__).joinpath(f"sql/{name}.sql").read_text("utf-8")
    )
