"""The sans-I/O core of DeterministicSaver: every saver operation, written once.

Each operation is a generator speaking the batch protocol of ``_batch``: it yields the
statements to send and gets their rows back; the drivers (``_drivers``, run by
``saver.py``) only execute batches, so the sync and async APIs cannot drift apart.

The operations are plain storage in the peer's shape (langgraph-checkpoint-postgres's
tables and rows, mapped by ``_rows``) plus the hooks the retry contract plugs into: every
write asks its :class:`~.contract.RunContract` for the stored metadata and the parameters
of its fencing statement, and a graph run's load asks it whether the run may start
(``_start_graph_run``). A ``RunContract("off")`` makes them the peer's storage.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    writes_sort_key,
)
from psycopg.types.json import Jsonb

from langgraph_deterministic._compat.langgraph import TASKS, DeltaSnapshot
from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.checkpointer._row_types import CheckpointRow, StartRow
from langgraph_deterministic.checkpointer._rows import (
    Codec,
    check_shape,
    checkpoint_json,
    config_for,
    load_tuple,
    metadata_json,
    next_version,
)
from langgraph_deterministic.checkpointer._statements import (
    _AT_CHECKPOINT,
    _LATEST,
    _block,
    _chunks,
    _list_sql,
    _numbered,
    _put_sql,
    _riding,
    _rows_sql,
)
from langgraph_deterministic.checkpointer._statements import (
    ROWS_MAX as ROWS_MAX,  # re-exported: the tests size their batches by it
)
from langgraph_deterministic.checkpointer.contract import (
    ATTEMPT_KEY,
    BRANCH_KEY,
    BRANCHING,
    HEAD_KEY,
    RUN_ID_KEY,
    SQLSTATE_COMMAND_REPLAY,
    SQLSTATE_LEASED,
    Admission,
    CallInfo,
    HeldLease,
    Lease,
    ParentRow,
    RunContract,
    RunRecord,
    carry_run_id,
    fingerprint_kind,
    head_mark,
    lost_admission_error,
    translate_guard_error,
)
from langgraph_deterministic.errors import (
    CheckpointPrunedError,
    ConfigurationError,
    DeterministicError,
    PruneArgumentError,
    PruneRefusedError,
    RunSweptError,
)

# Storage without the retry contract (policy "off"): what the peer does, minus secrets.
_NO_CONTRACT = RunContract("off")

# --- operations -------------------------------------------------------------------


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


def _refuse_missing_checkpoint(thread_id: str, checkpoint_id: str) -> None:
    raise ConfigurationError(
        f"Checkpoint {checkpoint_id} does not exist on thread {thread_id!r} (it was never "
        "written, or it was pruned or deleted). Running from it would start an empty "
        "conversation that names the missing checkpoint as its parent, and the thread's "
        "history would fall off the chain. Nothing was run. Address a checkpoint that exists "
        "(see graph.get_state_history), or leave checkpoint_id out to continue from the "
        "thread's latest checkpoint."
    )


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


_CHECKPOINT = CheckpointRow._fields.index("checkpoint")
_PARENT = CheckpointRow._fields.index("parent_checkpoint_id")


def _with_pending_sends(codec: Codec, rows: list[tuple[Any, ...]]) -> Operation[None]:
    """Checkpoints of format v < 4 keep pending Sends as writes of their parent: fold them
    into the TASKS channel the way current LangGraph expects to find them."""
    old = [
        (i, CheckpointRow._make(r))
        for i, r in enumerate(rows)
        if isinstance(r[_CHECKPOINT], dict) and r[_CHECKPOINT].get("v", 4) < 4 and r[_PARENT]
    ]
    if not old:
        return
    (sends,) = yield Batch.read(
        queries()["pending_sends"],
        {
            "thread_ids": [r.thread_id for _, r in old],
            "checkpoint_ns": [r.checkpoint_ns for _, r in old],
            "checkpoint_ids": [r.parent_checkpoint_id for _, r in old],
        },
    )
    by_parent = {(s[0], s[1], s[2]): s for s in sends or ()}
    for i, row in old:
        found = by_parent.get((row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id))
        if found is None:
            continue
        packets = [codec.loads(t, b) for t, b in zip(found[3], found[4], strict=True)]
        type_, blob = codec.dumps("pending sends", packets)
        versions = row.checkpoint.setdefault("channel_versions", {})
        versions[TASKS] = max(versions.values()) if versions else next_version(None)
        # Append to the row's blob arrays (they may be NULL when it had no blobs).
        rows[i] = row._replace(
            channels=[*(row.channels or []), TASKS],
            types=[*(row.types or []), type_],
            blobs=[*(row.blobs or []), blob],
        )


def get_tuple(
    codec: Codec,
    config: RunnableConfig,
    contract: RunContract | None = None,
    journal_attempt: str | None = None,
) -> Operation[CheckpointTuple | None]:
    """``journal_attempt``: the attempt a PostgresJournal session runs; a graph run of that
    attempt registers it in the journal at its admission (see _start_graph_run)."""
    thread_id, ns = _thread_ns(config)
    select = queries()["select_checkpoint"]
    info = contract.call_info(config, thread_id, ns) if contract is not None else None
    if info is not None and info.in_graph_run:
        check_key_sizes(thread_id, ns, info.run_id, get_checkpoint_id(config))
    if info is not None and contract is not None and contract.checks_start(info):
        return (yield from _start_graph_run(codec, config, contract, info, journal_attempt))
    params = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id := get_checkpoint_id(config):
        storable("checkpoint_id", checkpoint_id)
        sql = select + _AT_CHECKPOINT
        params["checkpoint_id"] = checkpoint_id
    else:
        sql = select + _LATEST
    (rows,) = yield Batch.read(sql, params)
    if not rows:
        if checkpoint_id and info is not None and info.in_graph_run and info.root:
            _refuse_missing_checkpoint(thread_id, checkpoint_id)
        return None
    yield from _with_pending_sends(codec, rows)
    found_tuple = load_tuple(codec, rows[0])
    if info is not None and contract is not None and contract.enforced:
        if info.in_graph_run:
            return _for_graph_run(found_tuple, info)
        carry_run_id(info, found_tuple.config, found_tuple.parent_config)
    return found_tuple


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
            queries()["select_addressed_with_run"].replace("{select_checkpoint}", select),
            {"thread_id": thread_id, "run_id": info.run_id, "checkpoint_id": addressed},
            fetch=True,
        )
    else:
        read = Statement(
            queries()["select_head_with_run"].replace("{select_checkpoint}", select),
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


def renew_leases(held: Sequence[HeldLease]) -> Operation[None]:
    """The heartbeat: extend the leases of the graph runs in flight in this process."""
    if not held:
        return
    yield Batch.write(
        Statement(
            queries()["renew_leases"],
            {"threads": [h.thread_id for h in held], "runs": [h.run_id for h in held]},
            prepare=False,
        )
    )


def _for_graph_run(
    found: CheckpointTuple,
    info: CallInfo,
    attempt: str | None = None,
    branch_from: str | None = None,
    head: str | None = None,
) -> CheckpointTuple:
    """The tuple a graph run loads: with an attempt token in its config (LangGraph copies
    it into every write of this run attempt, which is how the fencing tells attempts
    apart), the checkpoint it branches from when it addressed a past one on purpose, what
    it loaded (``head``: see HEAD_KEY), and the run id in the form the caller used, so
    LangGraph's own ``metadata.run_id`` comparison holds for a ``uuid.UUID`` too."""
    # Drawn from the OS, not uuid.uuid4(): tests (LangGraph's among them) patch uuid4 to
    # make ids deterministic, and a draw of ours would shift every id after it.
    configurable = {
        **found.config["configurable"],
        ATTEMPT_KEY: attempt or secrets.token_hex(16),
    }
    if branch_from is not None:
        configurable[BRANCH_KEY] = branch_from
    if head is not None:
        configurable[HEAD_KEY] = head
    metadata = found.metadata
    if (
        info.raw_run_id is not None
        and not isinstance(info.raw_run_id, str)
        and metadata.get(RUN_ID_KEY) == info.run_id
    ):
        metadata = cast(CheckpointMetadata, {**metadata, RUN_ID_KEY: info.raw_run_id})
    return found._replace(config={**found.config, "configurable": configurable}, metadata=metadata)


def list_checkpoints(
    codec: Codec,
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> Operation[list[CheckpointTuple]]:
    params: dict[str, Any] = dict.fromkeys(
        ("thread_id", "checkpoint_ns", "checkpoint_id", "run_id", "filter", "before", "limit")
    )
    if config:
        params["thread_id"], _ = _thread_ns(config)
        params["checkpoint_ns"] = config["configurable"].get("checkpoint_ns")
        params["checkpoint_id"] = get_checkpoint_id(config) or None
    for key in ("checkpoint_ns", "checkpoint_id"):
        if isinstance(params[key], str):
            storable(key, params[key])
    if filter:
        run_id = filter.get("run_id")
        if isinstance(run_id, str):
            params["run_id"] = run_id
        params["filter"] = Jsonb(dict(filter))
    if before is not None:
        params["before"] = get_checkpoint_id(before) or None
        if params["before"] is not None:
            storable("checkpoint_id", str(params["before"]))
    if limit is not None:
        params["limit"] = int(limit)
    # Unprepared: planned with the parameters' values, so only the conditions given stay.
    (rows,) = yield Batch((Statement(_list_sql(), params, fetch=True, prepare=False),))
    if not rows:
        return []
    yield from _with_pending_sends(codec, rows)
    return [load_tuple(codec, r) for r in rows]


def put(
    codec: Codec,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
    contract: RunContract | None = None,
    pending: Sequence[Statement] = (),
) -> Operation[RunnableConfig]:
    """``pending``: statements of ``put_writes`` calls to send first in the same
    transaction, after any read this put makes (the superstep's writes, see
    ``_writebuffer``)."""
    thread_id, ns = _thread_ns(config)
    parent_id = config["configurable"].get("checkpoint_id")
    if parent_id:  # before the checks that compare it
        check_key_sizes(thread_id, ns, None, str(parent_id))
    if contract is None:
        contract = _NO_CONTRACT
    info = contract.call_info(config, thread_id, ns)
    contract.require_run_id(info, "A checkpoint write")
    stored_run_id = metadata.get(RUN_ID_KEY)
    check_key_sizes(
        thread_id,
        ns,
        info.run_id or (str(stored_run_id) if stored_run_id is not None else None),
        str(checkpoint["id"]),
    )

    stored = checkpoint.copy()
    inline = stored["channel_values"] = dict(checkpoint["channel_values"])
    # Primitives stay inline in the checkpoint row (as the peer does); everything else
    # goes to checkpoint_blobs, once per (channel, version).
    blob_rows: list[dict[str, Any]] = []
    for channel, value in checkpoint["channel_values"].items():
        if value is None or isinstance(value, str | int | float | bool):
            continue
        if isinstance(value, DeltaSnapshot):
            inline[channel] = True  # marker: the snapshot's value is in the blob
        else:
            del inline[channel]
        if channel in new_versions:
            type_, blob = codec.dumps(f"channel {channel!r}", value)
            blob_rows.append(
                {"channel": channel, "version": str(new_versions[channel]), "type": type_,
                 "blob": blob}
            )  # fmt: skip
    source = metadata.get("source")
    parent: ParentRow | None = None
    if contract.needs_parent(info, parent_id, source):
        (found,) = yield Batch.read(
            queries()["select_parent_progress"],
            {"thread_id": thread_id, "checkpoint_id": parent_id},
        )
        parent = (found[0][0], found[0][1]) if found else None
    row = {
        "thread_id": thread_id,
        "checkpoint_ns": ns,
        "checkpoint_id": checkpoint["id"],
        "parent_checkpoint_id": parent_id,
        "checkpoint": checkpoint_json(stored),
        "metadata": metadata_json(contract.stored_metadata(config, metadata, info)),
    }
    guard = contract.guard_put(info, parent_id, checkpoint, source, parent)
    held = _admitted_attempt_of(info) if guard is not None and guard["ledger"] else None
    if held is not None and guard is not None:
        assert info.recorder is not None  # held comes from it
        written = info.recorder.ledger_written
        if written is not None and written[0] is held and written[1] == info.attempt:
            # A committed write of this attempt has made its ledger row current (running,
            # this attempt): lgd_put_checkpoint_v6 would read the row on every write to
            # find nothing to change, and the parent's run id to find it is this run's.
            # Left alone, a row this attempt's own interrupt write marked `interrupted`
            # stays so under durability "async", where a put can land after it.
            guard.update(ledger=False, closes=None, closes_run=None)
        elif guard["closes"] is not None and held.started_empty:
            # A graph run that found its thread empty continues only its own checkpoints:
            # its first write closes no run either.
            guard["closes"] = None
    # With a guard: the upsert, the lease, the claim of the parent's child slot (fencing)
    # and the run ledger, in one statement (guarded_put_checkpoint). The blobs ride in it
    # (put_with; beyond ROWS_MAX, the first ones go in statements of their own before it).
    # The superstep's pending writes go first, as statements of their own in the same
    # transaction, so a fence refusal (LG410, LG412) comes before the put's own checks.
    # (Folding them into the put's statement too was measured: no gain, more shapes.)
    name, params = (
        ("upsert_checkpoint", row) if guard is None else ("guarded_put_checkpoint", {**row, **guard})
    )
    statements = list(pending) if guard is None else [_riding(st) for st in pending]
    blob_chunks = _chunks(blob_rows)
    shared = {"thread_id": thread_id, "checkpoint_ns": ns}
    statements.extend(
        Statement(_rows_sql("insert_blobs", "blob_row", len(c)), _numbered(c, shared))
        for c in blob_chunks[:-1]
    )
    blobs = blob_chunks[-1] if blob_chunks else []
    statements.append(Statement(_put_sql(name, len(blobs)), _numbered(blobs, params)))
    try:
        yield Batch.write(*statements)
    except Exception as exc:
        if (ours := translate_guard_error(exc, info)) is not None:
            if (yield from _lost_admission(exc, info)):
                raise lost_admission_error(info) from None
            raise ours from None
        raise
    if info.recorder is not None:
        info.recorder.stored = True
    if held is not None and guard is not None and guard["ledger"]:
        assert info.recorder is not None
        info.recorder.ledger_written = (held, info.attempt)  # committed: the row is current
    stored_config = config_for(thread_id, ns, checkpoint["id"])
    if contract.enforced:
        carry_run_id(info, stored_config)
    return stored_config


def _admitted_attempt_of(info: CallInfo) -> HeldLease | None:
    """The lease of the graph run attempt admitted by this call, when this root write is
    one of that attempt's own (not a subgraph's, nor another call's reusing the config)."""
    held = info.recorder.held if info.recorder is not None else None
    if (
        held is not None
        and info.in_graph_run
        and info.root
        and (held.thread_id, held.run_id) == (info.thread_id, info.run_id)
        and info.attempt in (None, held.attempt)  # a new thread's writes carry none
    ):
        return held
    return None


def _lost_admission(exc: BaseException, info: CallInfo) -> Operation[bool]:
    """Whether an LG413 ("another run holds the thread") names exactly the lease this
    attempt's admission replaced: then no run took the thread over, the database lost the
    admission (a failover to a standby that had not received it). One read, on this error
    path only."""
    held = info.recorder.held if info.recorder is not None else None
    if (
        getattr(exc, "sqlstate", None) != SQLSTATE_LEASED
        or held is None
        or held.replaced is None
        or held.thread_id != info.thread_id
    ):
        return False
    (rows,) = yield Batch.read(queries()["lease_holder"], {"thread_id": held.thread_id})
    return rows is not None and len(rows) == 1 and tuple(rows[0]) == held.replaced


def put_writes(
    codec: Codec,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
    contract: RunContract | None = None,
) -> Operation[None]:
    if not writes:
        return
    thread_id, ns = _thread_ns(config)
    if contract is None:
        contract = _NO_CONTRACT
    info = contract.call_info(config, thread_id, ns)
    contract.require_run_id(info, "A pending write")
    checkpoint_id = config["configurable"]["checkpoint_id"]
    check_key_sizes(thread_id, ns, info.run_id, str(checkpoint_id))
    rows = []
    for idx, (channel, value) in enumerate(writes):
        type_, blob = codec.dumps(f"a write to channel {channel!r}", value)
        rows.append(
            {"task_id": task_id, "task_path": task_path, "idx": WRITES_IDX_MAP.get(channel, idx),
             "channel": channel, "type": type_, "blob": blob}
        )  # fmt: skip
    # Special writes (error, interrupt...) replace the task's previous one, one statement
    # per row (an upsert cannot touch a row twice in one statement); others are
    # first-writer-wins, ROWS_MAX rows per statement.
    special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
    statements = []
    shared = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    guard = contract.guard_writes(info, checkpoint_id, task_id, (c for c, _ in writes))
    if guard is not None:
        if guard["command"] or guard["interrupted"]:
            statements.append(Statement(queries()["guard_writes"], guard))
        shared.update(slot=guard["slot"], attempt=guard["attempt"], run_id=guard["run_id"])
    if special:
        one = {**shared, "replace": True} if guard is not None else shared
        sql = _block("upsert_write" if guard is None else "guarded_write")
        statements.append(Statement(sql, [{**one, **r} for r in rows], many=True))
    else:
        block = "insert_writes" if guard is None else "guarded_writes"
        statements.extend(
            Statement(_rows_sql(block, "write_row", len(c)), _numbered(c, shared))
            for c in _chunks(rows)
        )
    try:
        yield Batch.write(*statements)
    except Exception as exc:
        if (ours := translate_guard_error(exc, info)) is None:
            raise
        if (yield from _lost_admission(exc, info)):
            raise lost_admission_error(info) from None
        if (
            guard is not None
            and guard["attempt"]
            and getattr(exc, "sqlstate", None) == (SQLSTATE_COMMAND_REPLAY)
        ):
            # LangGraph has applied the duplicate Command in memory already: make sure
            # this attempt cannot store what it computes from it.
            yield Batch.write(Statement(queries()["refuse_attempt"], guard))
        raise ours from None
    if info.recorder is not None:
        info.recorder.stored = True
    if guard is not None and guard["interrupted"]:
        held = _admitted_attempt_of(info)
        if held is not None and info.recorder is not None:  # for its release (release_lease)
            info.recorder.interrupted_at = (held, checkpoint_id)


def get_run(codec: Codec, thread_id: str, run_id: str) -> Operation[RunRecord | None]:
    """The ledger row of one run and the checkpoint it last wrote (its final state once it
    has finished), in one round trip."""
    storable("thread_id", thread_id)
    storable("run_id", run_id)
    (rows,) = yield Batch.read(
        queries()["select_run"].replace("{select_checkpoint}", queries()["select_checkpoint"]),
        {"thread_id": str(thread_id), "run_id": str(run_id)},
    )
    if not rows:
        return None
    row = rows[0]
    (thread, run, status, attempts, first_id, last_id, fingerprint, superseded_by,
     created_at, updated_at, strategy, outcome,
     l_run, l_attempt, l_strategy, l_outcome, l_acquired, l_expires, l_ended) = row[:19]  # fmt: skip
    checkpoint_row = row[19:]
    state = None
    if checkpoint_row[0] is not None:
        found = [tuple(checkpoint_row)]
        yield from _with_pending_sends(codec, found)
        state = load_tuple(codec, found[0])
    lease = (
        Lease(l_run, l_attempt, l_strategy, l_outcome, l_acquired, l_expires, l_ended)
        if l_run is not None
        else None
    )
    if status == "running" and lease is not None and lease.run_id == run and lease.ended == "ok":
        # Its graph call returned (not at an interrupt: that reads "interrupted"). The
        # ledger row says so only once the next run starts; the lease knows already.
        status = "done"
    return RunRecord(
        thread_id=thread,
        run_id=run,
        status=status,
        attempts=attempts,
        first_checkpoint_id=first_id,
        last_checkpoint_id=last_id,
        input_fingerprint=fingerprint,
        superseded_by=superseded_by,
        created_at=created_at,
        updated_at=updated_at,
        last_checkpoint=state,
        multitask_strategy=strategy,
        multitask_outcome=outcome,
        lease=lease,
    )


def delete_thread(thread_id: str) -> Operation[None]:
    yield Batch.write(Statement(queries()["delete_threads"], {"thread_ids": [str(thread_id)]}))


def delete_for_runs(run_ids: Sequence[str]) -> Operation[None]:
    ids = [str(r) for r in run_ids]
    if not ids:
        return
    yield Batch.write(
        Statement(queries()["no_jit"], prepare=False),
        Statement(queries()["delete_for_runs"], {"run_ids": ids}, prepare=False),
    )


def copy_thread(source: str, target: str) -> Operation[None]:
    if str(source) == str(target):
        raise ConfigurationError(
            f"copy_thread got the same thread id {source!r} as source and target; "
            "pass a new target thread id."
        )
    yield Batch.write(
        Statement(queries()["copy_thread"], {"source": str(source), "target": str(target)})
    )


PRUNE_STRATEGIES = ("keep_latest", "delete")


def prune(thread_ids: Sequence[str], strategy: str) -> Operation[None]:
    if isinstance(thread_ids, str):
        raise PruneArgumentError(
            "prune() takes a sequence of thread ids, not a str: prune([thread_id])."
        )
    if strategy not in PRUNE_STRATEGIES:
        raise ConfigurationError(
            f"Unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'."
        )
    ids = [str(t) for t in thread_ids]
    if not ids:
        return
    if strategy == "delete":
        yield Batch.write(Statement(queries()["delete_threads"], {"thread_ids": ids}))
        return
    (delta,) = yield Batch.read(queries()["delta_threads"], {"thread_ids": ids})
    if delta:
        raise _delta_refusal(sorted(r[0] for r in delta), "Nothing was pruned.")
    # One transaction per thread, on one snapshot of it: a run appending meanwhile is safe,
    # and the statement checks again on that snapshot for a thread turned delta since.
    for done, thread_id in enumerate(ids):
        (refused,) = yield Batch.write(
            Statement(
                queries()["prune_keep_latest"], {"thread_id": thread_id}, fetch=True,
                prepare=False,
            ),
            isolation="repeatable read",
        )  # fmt: skip
        if refused and refused[0][0]:
            pruned = ", ".join(ids[:done]) or "none"
            raise _delta_refusal(
                [thread_id], f"It was left as it was; threads pruned before it: {pruned}."
            )


def _delta_refusal(thread_ids: Sequence[str], outcome: str) -> PruneRefusedError:
    return PruneRefusedError(
        "keep_latest cannot prune threads that use a DeltaChannel (their latest value "
        f"is rebuilt from older checkpoints): {', '.join(thread_ids)}. Prune them with "
        f"strategy='delete', or leave them out. {outcome}"
    )


def delta_history(
    codec: Codec, config: RunnableConfig, channels: Sequence[str]
) -> Operation[dict[str, DeltaChannelHistory]]:
    """Writes and seed per channel along the parent chain, in one round trip."""
    channels = list(channels)
    if not channels:
        return {}
    thread_id, ns = _thread_ns(config)
    checkpoint_id = get_checkpoint_id(config)
    if not checkpoint_id:
        head = yield from get_tuple(codec, config)
        if head is None:
            return {ch: {"writes": []} for ch in channels}
        checkpoint_id = head.config["configurable"]["checkpoint_id"]
    (rows,) = yield Batch.read(
        queries()["delta_history"],
        {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
            "channels": channels,
        },
    )
    writes: dict[str, list[tuple[int, tuple[str, str, int], PendingWrite]]] = {
        ch: [] for ch in channels
    }
    result: dict[str, DeltaChannelHistory] = {}
    seeds: dict[str, Any] = {}
    for kind, _cid, depth, channel, type_, blob, task_id, task_path, idx, inline in rows or ():
        if kind == "w":
            value = codec.loads(type_, blob)
            key = writes_sort_key(task_path, task_id, idx)
            writes[channel].append((depth, key, (task_id, channel, value)))
        else:
            seeds[channel] = codec.loads(type_, blob) if type_ is not None else inline
    for ch in channels:
        # Oldest checkpoint first (deepest), and within one the order live execution used.
        ordered = sorted(writes[ch], key=lambda w: (-w[0], w[1]))
        entry: DeltaChannelHistory = {"writes": [w[2] for w in ordered]}
        if ch in seeds:
            entry["seed"] = seeds[ch]
        result[ch] = entry
    return result


# --- a run's writes in one transaction (DeterministicRunner with a journal) --------------

#: ``("put", config, checkpoint, metadata, new_versions)`` or
#: ``("writes", config, writes, task_id, task_path)``, in the order LangGraph made them.
BufferedWrite = tuple[Any, ...]


def put_batch(
    codec: Codec,
    items: Sequence[BufferedWrite],
    contract: RunContract | None = None,
    release: tuple[HeldLease, str] | None = None,
) -> Operation[str | None]:
    """Store a run's buffered checkpoint writes atomically, at most once.

    DeterministicRunner keeps a run's writes in memory while a durable journal drives it
    and commits them here once the graph returns: the same statements, guards and ledger
    updates as one ``put``/``put_writes`` call each, in one transaction. If the checkpoint
    the run started from (the parent of its first root checkpoint) already has a child
    written by the same run (an earlier execution of this commit got through, e.g. before
    a crash), nothing is written and that child's id is returned; otherwise None.

    ``release`` (the run's lease and ``ok``/``error``): the commit ends the run, so it
    releases the lease in the same transaction. Under a journal the graph call of one
    attempt is not the run (a suspended or killed attempt raises through it, a replay
    never admits), so the call's callbacks must not decide the lease.
    """
    end = None if release is None else _release_statement(*release)
    if not items:
        if end is not None:
            yield Batch.write(end)
        return None
    if contract is None:
        contract = _NO_CONTRACT
    first_root = next(
        (
            i
            for i in items
            if i[0] == "put" and not (i[1].get("configurable") or {}).get("checkpoint_ns")
        ),
        None,
    )
    check: dict[str, Any] | None = None
    if first_root is not None:
        thread_id, _ = _thread_ns(first_root[1])
        info = contract.call_info(first_root[1], thread_id, "")
        parent = first_root[1]["configurable"].get("checkpoint_id") or None
        check = {"thread_id": thread_id, "parent": parent, "run_id": info.run_id}
        (rows,) = yield Batch.read(queries()["child_of_run"], check)
        if rows:
            if end is not None:  # released by that commit already, unless it predates this
                yield Batch.write(end)
            return str(rows[0][0])
    statements: list[Statement] = []
    infos: list[CallInfo] = []
    for item in items:
        kind, config = item[0], item[1]
        thread_id, ns = _thread_ns(config)
        infos.append(contract.call_info(config, thread_id, ns))
        a, b, c = item[2:5]
        op: Operation[Any] = (
            put(codec, config, a, b, c, contract)
            if kind == "put"
            else put_writes(codec, config, a, b, c, contract)
        )
        try:
            batch = next(op)  # each yields its one write batch first; it is not sent
        except StopIteration:
            continue  # put_writes with no writes
        # put/put_writes must stay "one write batch, then done" for this composition.
        assert batch.atomic, f"{kind} now starts with a read; put_batch must drive it"
        statements.extend(batch.statements)
        op.close()
    if end is not None:
        statements.append(end)
    try:
        yield Batch.write(*statements)
    except Exception as exc:
        if check is not None:
            # A concurrent execution of the same commit (a zombie attempt) won the race.
            (rows,) = yield Batch.read(queries()["child_of_run"], check)
            if rows:
                return str(rows[0][0])
        for info in infos:
            if (ours := translate_guard_error(exc, info)) is not None:
                if (yield from _lost_admission(exc, info)):
                    ours = lost_admission_error(info)
                if release is not None:  # refused: the run raised, as a direct call would
                    yield Batch.write(_release_statement(release[0], "error"))
                raise ours from None
        raise
    return None
