"""A graph run's admission: taking its thread's lease (per the run's multitask strategy,
waiting in the thread's queue under ``enqueue``) in the round trip that reads the head,
the start checks decided before LangGraph applies any input, and giving the lease back
(``release_lease``) when the run's graph call returns or raises.

``_reads.get_tuple`` hands a graph run's load here (``_start_graph_run``); the write path
(``_core``) releases the lease inside a journaled run's commit (``_release_statement``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, get_checkpoint_id

from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.checkpointer._loading import (
    _for_graph_run,
    _refuse_missing_checkpoint,
    _with_pending_sends,
)
from langgraph_deterministic.checkpointer._row_types import CheckpointRow, StartRow
from langgraph_deterministic.checkpointer._rows import Codec, check_shape, load_tuple
from langgraph_deterministic.checkpointer._statements import _AT_CHECKPOINT, _start_read_sql
from langgraph_deterministic.checkpointer.contract import (
    BRANCHING,
    RUN_ID_KEY,
    Admission,
    CallInfo,
    HeldLease,
    RunContract,
    fingerprint_kind,
    head_mark,
)
from langgraph_deterministic.errors import (
    CheckpointPrunedError,
    DeterministicError,
    RunSweptError,
)


def queue_channel(thread_id: str) -> str:
    """The NOTIFY channel of a thread's enqueue queue (as ``lgd_queue_channel_v3``)."""
    return "lgd_q_" + hashlib.md5(thread_id.encode("utf-8")).hexdigest()[:24]


def _start_graph_run(
    codec: Codec,
    config: RunnableConfig,
    contract: RunContract,
    info: CallInfo,
    journal_attempt: str | None = None,
) -> Operation[CheckpointTuple | None]:
    """A graph run loading its thread: the admission (the thread's lease, per the run's
    multitask strategy) and the start checks, decided before LangGraph applies any input.

    The lease is taken by the first statement of the same pipeline that reads the head:
    one round trip. Under READ COMMITTED the read takes its snapshot after the admission,
    which waited for any write of the previous holder in flight (they lock the lease
    row), so an interrupted or rolled-back run can store nothing the new run does not see.

    A run of ``journal_attempt`` (PostgresJournal's session) is admitted by
    ``lgd_journal_admit_v1`` instead: the same admission, which also registers the attempt
    in the journal as its first claim would (taking the run over from its other
    attempts), and returns the fence check its first op may start on
    (``HeldLease.fence_at``), so that op needs no claim of its own. A refused start undoes
    the registration with the lease.
    """
    contract.require_run_id(info, "A graph run")
    if info.recorder is not None and info.recorder.unfingerprinted is not None:
        # An input of arbitrary objects: refused now if it cannot be stored, before the
        # admission writes anything (LangGraph would store its writes, and under
        # durability "async" run every node, before its checkpoint failed).
        codec.dumps("the graph input", info.recorder.unfingerprinted[0])
    thread_id = info.thread_id
    select = queries()["select_checkpoint"]
    addressed = get_checkpoint_id(config) if info.addressed else None
    if addressed:
        read = Statement(
            _start_read_sql("select_addressed_with_run"),
            {"thread_id": thread_id, "run_id": info.run_id, "checkpoint_id": addressed},
            fetch=True,
        )
    else:
        read = Statement(
            _start_read_sql("select_head_with_run"),
            {"thread_id": thread_id, "run_id": info.run_id},
            fetch=True,
        )
    # A DeterministicRunner names its attempt itself (its durable-op journal is fenced by
    # the same token); any other graph run gets a fresh one (not uuid4: see _for_graph_run).
    attempt = info.attempt or secrets.token_hex(16)
    journaled = journal_attempt is not None and info.attempt == journal_attempt
    admit = queries()["journal_admit" if journaled else "admit"]
    fence_at = None
    strategy = contract.strategy_of(info)
    admission: Admission | None = None
    ticket: int | None = None
    waited = 0.0
    started = time.monotonic()
    while True:
        params = contract.admission(info, attempt, ticket)
        statements = (
            [read] if params is None else [Statement(admit, params, fetch=True), read]
        )
        results = yield Batch(tuple(statements))
        rows = results[-1] or []
        if params is None:
            break
        admission = Admission.from_row((results[-2] or [])[0])
        if admission.verdict == "admitted":
            fence_at = admission.fence_at if journaled else None
            break
        if admission.verdict == "unfinished":
            # How the unfinished run was started decides the fix the error names (one
            # read, on the refusal only): its attempts in the journal mean a runner's.
            holder = admission.holder
            (in_journal,) = yield Batch.read(
                queries()["run_journaled"],
                {"thread_id": thread_id, "run_id": holder.run_id if holder else None},
            )
            contract.refuse_unfinished(info, admission, bool(in_journal))
        if strategy != "enqueue":
            contract.refuse_busy(info, admission, None)
        ticket = admission.ticket
        waited = time.monotonic() - started
        remaining = contract.enqueue_timeout - waited
        if remaining <= 0:
            yield Batch.write(
                Statement(queries()["leave_queue"], {"thread_id": thread_id, "ticket": ticket})
            )
            contract.refuse_busy(info, admission, waited)
        # Holding no connection (the saver gives it back to the pool: _waiting), woken by
        # the release that makes this ticket the first (NOTIFY); the pause bounds the wait
        # when a holder dies without releasing (its lease expires) or NOTIFY cannot reach
        # us, and renews the ticket (a waiter that stops looking is skipped).
        pause = min(remaining, max(0.05, min(1.0, contract.lease_ttl / 4)))
        try:
            yield Batch((), wait=(queue_channel(thread_id), pause), ticket=ticket)
        except GeneratorExit:
            raise
        except BaseException:
            # Cancelled (or interrupted) while queued: leave the queue, then raise.
            yield Batch.write(
                Statement(queries()["leave_queue"], {"thread_id": thread_id, "ticket": ticket})
            )
            raise
    start = StartRow.of(rows[0] if rows else None)
    head, ledger = start.head, start.ledger
    admitted = admission is not None and admission.verdict == "admitted"
    mark: str | None = None
    run_swept_at, run_swept_strategy = start.run_swept_at, start.run_swept_strategy
    thread_swept_at, thread_kept = start.thread_swept_at, start.thread_kept
    try:
        if head is not None:
            check_shape(head)
        if (
            run_swept_at is not None
            and ledger is None
            and (head is None or head.metadata.get(RUN_ID_KEY) != info.run_id)
        ):
            _refuse_swept(thread_id, str(info.run_id), run_swept_at, run_swept_strategy)
        decision = contract.decide_start(info, head.metadata if head else None, ledger)
        if decision.action == "final" and not addressed:
            (found,) = yield Batch.read(
                select + _AT_CHECKPOINT,
                {
                    "thread_id": thread_id,
                    "checkpoint_ns": "",
                    "checkpoint_id": decision.checkpoint_id,
                },
            )
            if not found:
                # Its final checkpoint was pruned: loading nothing would apply its input
                # again to a thread that holds it already.
                _refuse_swept(thread_id, str(info.run_id), thread_swept_at, "keep_latest")
            head = CheckpointRow._make(found[0]) if found else None
        if head is None:
            if addressed:
                if thread_swept_at is not None:
                    _refuse_pruned(thread_id, addressed, thread_swept_at, thread_kept)
                _refuse_missing_checkpoint(thread_id, addressed)
            loaded = None
        else:
            # Before the fold of pending sends below, which edits the row in place.
            mark = head_mark(head.checkpoint_id, head.metadata, head.checkpoint)
            head_rows: list[tuple[Any, ...]] = [head]
            yield from _with_pending_sends(codec, head_rows)
            loaded = load_tuple(codec, head_rows[0])
            head_run = loaded.metadata.get(RUN_ID_KEY)
            if not addressed and info.run_id is not None and (
                decision.action == "final"
                or (admission is not None and admission.outcome == "finished")
            ):
                # Its call had returned: a retry, or a reused run id dropping new work.
                contract.finished_again(info, loaded.checkpoint.get("ts"))
            holder = admission.holder if admission is not None else None
            if (
                not addressed
                and head_run != info.run_id
                and strategy != "interrupt"
                and (holder is None or holder.run_id != head_run)
            ):
                # Nothing of ours explains the head (no lease of its run): look at it.
                contract.check_stuck_head(info, loaded, fingerprint_kind(info.fingerprint))
    except DeterministicError:
        if admitted and admission is not None:
            undo = [Statement(queries()["unadmit"], _unadmit_params(thread_id, attempt, admission))]
            if fence_at is not None:
                undo.append(
                    Statement(
                        queries()["journal_unadmit"], {"thread_id": thread_id, "attempt": attempt}
                    )
                )
            yield Batch.write(*undo)
        raise
    if admitted and info.recorder is not None and info.run_id is not None:
        before = admission.holder if admission is not None else None
        info.recorder.held = HeldLease(
            thread_id, info.run_id, attempt, fence_at, started_empty=loaded is None,
            replaced=None if before is None or before.attempt == attempt
            else (before.run_id, before.attempt, before.acquired_at),
            admission=admission,
        )  # fmt: skip
        info.recorder.stored = False  # this attempt's writes, from here on
    if loaded is None:
        _note_branch(info, None)
        return None
    branch_from = None
    if addressed and start.latest is not None and start.latest != addressed:
        branch_from = addressed  # a past checkpoint, addressed on purpose: a branch
    # Addressed at all (the head included: a fork update_state made), the run travels in
    # time for LangGraph, whose subgraphs then replay from before that point.
    _note_branch(info, attempt if addressed else None)
    return _for_graph_run(loaded, info, attempt, branch_from, mark)


def _note_branch(info: CallInfo, attempt: str | None) -> None:
    """Tell this run's subgraphs whether it travels in time, and its attempt token (see
    BRANCHING). Right after an addressed load LangGraph loads the thread's latest
    checkpoint, unaddressed, to see whether the addressed one was superseded: that probe
    of the same run keeps the mark."""
    if attempt is not None:
        BRANCHING.set((info.thread_id, info.run_id, attempt, True))
        return
    current = BRANCHING.get()
    if current is not None and current[3] and current[:2] == (info.thread_id, info.run_id):
        BRANCHING.set((*current[:3], False))  # the probe: once
    else:
        BRANCHING.set(None)


def _unadmit_params(thread_id: str, attempt: str, admission: Admission) -> dict[str, Any]:
    lease = admission.holder
    return {
        "thread_id": thread_id,
        "attempt": attempt,
        "run_id": lease.run_id if lease else None,
        "holder_attempt": lease.attempt if lease else None,
        "expires_at": lease.expires_at if lease else None,
        "ended": lease.ended if lease else None,
        "strategy": lease.strategy if lease else None,
        "outcome": lease.outcome if lease else None,
        "acquired_at": lease.acquired_at if lease else None,
    }


#: Admissions an attempt that stored nothing may undo: those that changed nothing but the
#: lease (interrupt and rollback outcomes changed the other run too).
_UNDOABLE = frozenset({"free", "enqueued", "retry"})


def release_lease(
    held: HeldLease,
    ended: str,
    *,
    lazy: bool = False,
    interrupted_at: str | None = None,
    stored: bool = True,
) -> Operation[None]:
    """The graph call of a lease holder returned (``ok``), raised (``error``) or lost a
    race to another attempt of its own run (``lost``: changes nothing, see
    ``lgd_release_v4``).

    ``stored``: whether the attempt stored anything. One that raised before it stored
    anything (its input could not be serialised, it was cancelled before its first
    write) undoes its admission instead (``abandon_lease``): the lease goes back to what
    it was, and no row is left of a refused input.

    ``lazy``: nothing else is in the transaction, so its commit need not wait for the WAL
    flush (see release_lease_lazy): a release lost to a server crash is a lease that
    expires, as a crashed worker's does.

    ``interrupted_at``: the checkpoint of the last interrupt the call stored. Its run's
    ledger row is made ``interrupted`` there if it reads ``running``: under durability
    "async" the interrupt's write can commit before the put that creates the row. That
    transaction waits for the WAL flush, ``lazy`` or not."""
    admission = held.admission
    if (
        not stored
        and ended == "error"
        and interrupted_at is None
        and admission is not None
        and admission.outcome in _UNDOABLE
    ):
        params = _unadmit_params(held.thread_id, held.attempt, admission)
        yield Batch.write(Statement(queries()["abandon_lease"], params))
        return
    if interrupted_at is None:
        yield Batch.write(_release_statement(held, ended, lazy=lazy))
        return
    # The mark is the run's state, not only the lease's: its commit waits for the flush.
    release = _release_statement(held, ended)
    mark = {"thread_id": held.thread_id, "run_id": held.run_id, "attempt": held.attempt,
            "checkpoint_id": interrupted_at}  # fmt: skip
    yield Batch.write(Statement(queries()["mark_interrupted"], mark), release)


def _release_statement(held: HeldLease, ended: str, *, lazy: bool = False) -> Statement:
    return Statement(
        queries()["release_lease_lazy" if lazy else "release_lease"],
        {"thread_id": held.thread_id, "run_id": held.run_id, "attempt": held.attempt,
         "ended": ended},
    )  # fmt: skip


def _refuse_swept(thread_id: str, run_id: str, swept_at: Any, strategy: str | None) -> None:
    if swept_at is not None:
        how = f"was swept by a retention sweep at {swept_at:%Y-%m-%d %H:%M:%S %Z}"
    else:
        how = "had its checkpoints pruned (saver.prune or a retention sweep)"
    what = (
        "its thread's checkpoints, writes and ledger were deleted"
        if strategy == "delete"
        else "the checkpoints it wrote are gone (keep_latest kept only the thread's latest)"
    )
    raise RunSweptError(
        f"Run {run_id!r} on thread {thread_id!r} {how}: "
        f"{what}. Retrying it now would apply its input again, so nothing was run or "
        "written. Stop retrying this run (it had finished or been abandoned before its "
        "thread expired); new work takes a new run id. saver.get_run() no longer knows it; "
        "its tombstone (table lgd_swept_runs) is what refused this retry.",
        thread_id=thread_id, run_id=run_id, swept_at=swept_at,
    )  # fmt: skip


def _refuse_pruned(thread_id: str, checkpoint_id: str, swept_at: Any, kept: str | None) -> None:
    latest = f" It kept checkpoint {kept}." if kept else " It deleted the whole thread."
    raise CheckpointPrunedError(
        f"Checkpoint {checkpoint_id} of thread {thread_id!r} is gone: a retention sweep "
        f"removed it at {swept_at:%Y-%m-%d %H:%M:%S %Z}.{latest} Nothing was run. Address a "
        "checkpoint that exists (graph.get_state_history), or leave checkpoint_id out to "
        "continue from the thread's latest checkpoint."
    )
