"""The run ledger and the thread leases as Python reads them (tables ``lgd_runs`` and
``lgd_leases``; statuses written by the arbitration functions in SQL)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from langgraph.checkpoint.base import CheckpointTuple

#: ``lgd_runs.status`` (see RunRecord), written by the SQL only; the SQL spells the same
#: literals, and tests/checkpointer/test_schema.py checks every one it uses is here.
RunStatus = Literal["running", "interrupted", "done", "superseded", "rolled_back"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
#: What a root write of a new run makes of the run whose checkpoint it continues.
Closing = Literal["done", "superseded"]


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One run of one thread, as the ledger (table ``lgd_runs``) holds it."""

    status: str
    last_checkpoint_id: str | None
    input_fingerprint: str | None


@dataclass(frozen=True, slots=True)
class Lease:
    """A thread's lease (table ``lgd_leases``): the run and attempt holding the thread."""

    run_id: str
    attempt: str
    strategy: str
    #: how the holder got the thread: ``free``, ``retry``, ``enqueued``,
    #: ``interrupted <run>``, ``rolled back <run>``, ``continued after unfinished <run>``
    outcome: str
    acquired_at: _dt.datetime
    expires_at: _dt.datetime
    #: None while held; ``ok`` / ``error`` once the graph call returned / raised
    ended: str | None

    def live(self, now: _dt.datetime) -> bool:
        return self.ended is None and self.expires_at > now


@dataclass(frozen=True, slots=True)
class HeldLease:
    """The lease a graph run was admitted with, to release when its call returns."""

    thread_id: str
    run_id: str
    attempt: str
    #: a run PostgresJournal drives: when its admission registered the attempt in the
    #: journal (lgd_journal_admit_v1), the fence check its first op may start on
    fence_at: Any = None
    #: the run found its thread empty: every parent its root writes continue is its own
    #: checkpoint, so none of them closes another run (see _core.put)
    started_empty: bool = False
    #: (run, attempt, acquired_at) of the lease the admission replaced, if another's: an
    #: LG413 naming that very lease means the database lost the admission (a failover)
    replaced: tuple[str, str, Any] | None = None
    #: the admission that took it: an attempt that raises before storing anything undoes
    #: it (_core.release_lease), so a refused input leaves the lease as it found it
    admission: Admission | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Admission:
    """The row ``lgd_admit_v4`` returns (see migrations 0014, 0024). ``outcome``
    ``finished``: a retry of the run whose call returned, admitted without the lease."""

    verdict: Literal["admitted", "busy", "queued", "unfinished"]
    ticket: int | None
    holder: Lease | None
    outcome: str | None
    #: ``lgd_journal_admit_v2``'s eleventh column: the fence check a PostgresJournal
    #: attempt's first op may start on (None from ``lgd_admit_v4``)
    fence_at: Any = None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Admission:
        (verdict, ticket, run, attempt, expires, ended, strategy, outcome, acquired,
         mine) = row[:10]  # fmt: skip
        holder = (
            Lease(run, attempt, strategy, outcome, acquired, expires, ended)
            if run is not None
            else None
        )
        return cls(verdict, ticket, holder, mine, row[10] if len(row) > 10 else None)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as the ledger knows it: ``saver.get_run(thread_id, run_id)``.

    ``status`` is ``running`` (its call has not returned: it runs, or it crashed or
    raised and was not retried -- ``lease`` tells which), ``interrupted`` (stopped at an
    interrupt), ``done`` (its graph call returned, or a later run started after it had
    finished) or ``superseded`` (a
    later run moved the thread on before it finished; an interrupted run answered by a
    ``Command(resume=...)`` run reads so too). ``last_checkpoint`` is the
    checkpoint it wrote last: its final state once finished (for a ``running`` run, its
    newest root checkpoint at the time of the read). ``attempts`` counts the graph calls
    that wrote for it (retries included). ``rolled_back``: a later run started with
    ``multitask_strategy="rollback"`` removed its checkpoints.
    """

    thread_id: str
    run_id: str
    status: RunStatus
    attempts: int
    first_checkpoint_id: str
    last_checkpoint_id: str
    input_fingerprint: str | None
    superseded_by: str | None
    created_at: _dt.datetime
    updated_at: _dt.datetime
    last_checkpoint: CheckpointTuple | None
    #: the strategy the run was admitted under, and what that did (see Lease.outcome)
    multitask_strategy: str | None = None
    multitask_outcome: str | None = None
    #: the thread's lease while this run holds it (or held it last), else None
    lease: Lease | None = None

    @property
    def values(self) -> dict[str, Any]:
        """The channel values of the run's last checkpoint (its final state if finished)."""
        if self.last_checkpoint is None:
            return {}
        return dict(self.last_checkpoint.checkpoint["channel_values"])
