"""Named row types for the rows the core reads by column: what a position means is said
once, here, beside the statements in ``_db/sql/queries.sql`` that return them."""

from __future__ import annotations

from typing import Any, NamedTuple

from langgraph_deterministic.checkpointer._ledger import LedgerRow


class CheckpointRow(NamedTuple):
    """A row of ``select_checkpoint``: a checkpoint with its blobs and pending writes as
    parallel arrays (``_rows.load_tuple`` reads it; a tuple, so positions still work)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    channels: list[str] | None
    types: list[str] | None
    blobs: list[bytes | None] | None
    task_ids: list[str] | None
    w_channels: list[str] | None
    w_types: list[str] | None
    w_blobs: list[bytes | None] | None
    task_paths: list[str] | None
    idxs: list[int] | None


_CHECKPOINT_COLUMNS = len(CheckpointRow._fields)
_SWEEP_COLUMNS = ("run_swept_at", "run_swept_strategy", "thread_swept_at", "thread_kept")


class StartRow(NamedTuple):
    """The row of ``select_head_with_run`` / ``select_addressed_with_run``: the checkpoint
    a graph run starts from (None on a new thread), the calling run's ledger row (None
    when the head is its own or it has none), addressed, the thread's latest id, and what a
    retention sweep left of the run (its tombstone) and of the thread (migration 0026)."""

    head: CheckpointRow | None
    ledger: LedgerRow | None
    latest: str | None
    run_swept_at: Any = None
    run_swept_strategy: str | None = None
    thread_swept_at: Any = None
    thread_kept: str | None = None

    @classmethod
    def of(cls, row: tuple[Any, ...] | None) -> StartRow:
        if row is None:
            return cls(None, None, None)
        n = _CHECKPOINT_COLUMNS
        head = CheckpointRow._make(row[:n]) if row[0] is not None else None
        status, last_checkpoint_id, fingerprint = row[n : n + 3]
        ledger = (
            LedgerRow(
                status=status, last_checkpoint_id=last_checkpoint_id, input_fingerprint=fingerprint
            )
            if status is not None
            else None
        )
        # The addressed form has the latest id between the ledger's and the sweep's columns.
        rest = row[n + 3 :]
        latest = rest[0] if len(rest) == len(_SWEEP_COLUMNS) + 1 else None
        swept = rest[-len(_SWEEP_COLUMNS) :]
        return cls(head, ledger, latest, *swept)
