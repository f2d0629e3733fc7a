"""The ids a call names (thread, namespace, run, checkpoint): read from its config, and
refused before anything is written when Postgres could not store or index them. Shared
by the reads (``_reads``) and the write path (``_core``)."""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig

from langgraph_deterministic.errors import ConfigurationError

# Postgres refuses a btree entry over ~2.7 KB (a third of a page). thread_id shares index
# entries with checkpoint_ns (the checkpoint, blob and write keys) and with run_id (the run
# ledger's key); the sum of each pair is bounded well below the limit, leaving room for the
# other key columns and the tuple header.
MAX_KEY_BYTES = 2048


def storable(what: str, value: str) -> str:
    """``value`` when Postgres can store it as text, else our error: a NUL character ends
    as psycopg's DataError, a lone surrogate (``"\\ud800"``) as a UnicodeEncodeError, both
    raised after earlier statements of the call may have landed."""
    if "\x00" in value or (not value.isascii() and not _encodable(value)):
        raise ConfigurationError(
            f"The {what} {value!r:.100} cannot be stored: Postgres text holds no NUL "
            "character and only valid Unicode (no lone surrogate such as '\\ud800'). Use "
            "ids of printable text (e.g. a hash of a natural key). Nothing was run or written."
        )
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_key_sizes(
    thread_id: str, ns: str, run_id: str | None, checkpoint_id: str | None = None
) -> None:
    """Refuse ids too long to index, before anything is written (Postgres would raise
    ProgramLimitExceeded at the first index insert, after earlier statements landed)."""
    if run_id:
        storable("run_id", run_id)
    if checkpoint_id:
        storable("checkpoint_id", checkpoint_id)
    thread = len(thread_id.encode())
    sizes = {
        "checkpoint_ns": len(ns.encode()),
        # the checkpoints' and writes' primary keys hold all three
        "checkpoint_ns and checkpoint_id": len(ns.encode())
        + (len(checkpoint_id.encode()) if checkpoint_id else 0),
        "run_id": len(run_id.encode()) if run_id else 0,
    }
    for other, size in sizes.items():
        if thread + size > MAX_KEY_BYTES:
            raise ConfigurationError(
                f"The ids of this call are too long to index (thread_id {thread} bytes, "
                f"{other} {size} bytes; at most {MAX_KEY_BYTES} bytes together): Postgres "
                "cannot store a btree entry that large. Use shorter ids (e.g. a hash of a "
                "long natural key). Nothing was run or written."
            )


def _thread_ns(config: RunnableConfig) -> tuple[str, str]:
    configurable = config.get("configurable") or {}
    if "thread_id" not in configurable:
        raise ConfigurationError(
            "The config has no configurable.thread_id. Pass "
            "{'configurable': {'thread_id': ...}} (or use run_config(thread_id, run_id))."
        )
    thread_id = str(configurable["thread_id"])
    ns = str(configurable.get("checkpoint_ns") or "")
    if not (thread_id.isascii() and ns.isascii()) or "\x00" in thread_id or "\x00" in ns:
        storable("thread_id", thread_id)
        storable("checkpoint_ns", ns)
    return thread_id, ns
