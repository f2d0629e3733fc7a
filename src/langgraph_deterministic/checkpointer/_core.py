"""The write path of DeterministicSaver's sans-I/O core: checkpoints and pending writes
(``put``, ``put_writes``, a journaled run's ``put_batch``), the lease heartbeat, and
deleting, copying and pruning threads. The reads are ``_reads``, a graph run's admission
and lease release ``_admission``.

Each operation is a generator speaking the batch protocol of ``_db.batch``: it yields the
statements to send and gets their rows back; the drivers (``_db.drivers``, run by
``saver.py``) only execute batches, so the sync and async APIs cannot drift apart.

The operations are plain storage in the peer's shape (langgraph-checkpoint-postgres's
tables and rows, mapped by ``_rows``) plus the hooks the retry contract plugs into: every
write asks its :class:`~.contract.RunContract` for the stored metadata and the parameters
of its fencing statement. A ``RunContract("off")`` makes them the peer's storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
)

from langgraph_deterministic._compat.langgraph import DeltaSnapshot
from langgraph_deterministic._db.batch import Batch, Operation, Statement
from langgraph_deterministic._db.queries import queries
from langgraph_deterministic.checkpointer._admission import _release_statement
from langgraph_deterministic.checkpointer._ids import _thread_ns, check_key_sizes
from langgraph_deterministic.checkpointer._rows import (
    Codec,
    checkpoint_json,
    config_for,
    metadata_json,
)
from langgraph_deterministic.checkpointer._statements import (
    _block,
    _chunks,
    _numbered,
    _put_sql,
    _riding,
    _rows_sql,
)
from langgraph_deterministic.checkpointer.contract import (
    RUN_ID_KEY,
    SQLSTATE_COMMAND_REPLAY,
    SQLSTATE_LEASED,
    CallInfo,
    HeldLease,
    ParentRow,
    RunContract,
    carry_run_id,
    lost_admission_error,
    translate_guard_error,
)
from langgraph_deterministic.errors import (
    ConfigurationError,
    PruneArgumentError,
    PruneRefusedError,
)

# Storage without the retry contract (policy "off"): what the peer does, minus secrets.
_NO_CONTRACT = RunContract("off")

# --- operations -------------------------------------------------------------------


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
