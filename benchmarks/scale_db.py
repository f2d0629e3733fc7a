"""Build (or reuse) a big checkpoint database in langgraph-checkpoint-postgres's layout.

The schema is made by the peer's own ``PostgresSaver.setup()``; rows are loaded with
COPY in text format (formatted here, no per-row round trips), then the tables are
VACUUM ANALYZEd, as a production database that autovacuum has seen would be.

The layout is what a LangGraph deployment leaves behind: many ordinary threads plus a few
long ones, one root checkpoint per step (``source`` "input" on the first step of a run,
"loop" afterwards), a subgraph checkpoint every ``subgraph_every`` steps, a
``messages`` blob per step and pending writes per checkpoint, with runs of
``steps_per_run`` steps carrying a ``run_id`` in their metadata. Checkpoints of all
threads interleave in time, so a thread's rows are spread over the heap as they are in a
real database. Blobs and writes hold real serialised values, so both savers can load
every row.

API (used by ``bench_scale.py``; reusable by other benchmarks)::

    spec = ScaleSpec(checkpoints=1_000_000)
    info = ensure(dsn, spec)            # build unless a database of this spec is there
    info.long_threads[5000]             # thread ids of the 5,000-checkpoint threads
    info.run_ids(thread_id)             # the run ids of a thread

    # or, to plant extra rows of your own in the same COPY streams:
    with Loader(dsn) as load:
        layout = load.thread(ThreadPlan("t-1", steps=40, run_prefix="t-1:run"))
        load.checkpoint(...)            # any row you like, e.g. a fork or a bad run

``build(dsn, spec, plans=...)`` accepts extra :class:`ThreadPlan` objects (mixed in with
the generated ones) and an ``after_thread`` hook that receives each thread's
:class:`ThreadLayout` and the :class:`Loader`, to add faulty rows next to it.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg.rows import dict_row

INFO_TABLE = "bench_scale_info"
_SERDE = JsonPlusSerializer()
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ScaleSpec:
    """What to build. ``checkpoints`` counts every checkpoint row (subgraph ones too)."""

    checkpoints: int = 1_000_000
    long_threads: tuple[tuple[int, int], ...] = ((1000, 3), (5000, 3))  # (steps, how many)
    thread_steps: int = 50  # steps of an ordinary thread
    steps_per_run: int = 5
    subgraph_every: int = 10
    writes_per_checkpoint: int = 2
    message_bytes: int = 1200  # size of each stored messages blob

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class ThreadPlan:
    """One thread to generate: ``steps`` root checkpoints (plus subgraph ones)."""

    thread_id: str
    steps: int
    run_prefix: str | None = None  # run ids are f"{run_prefix}-{n}"; None: no run ids
    steps_per_run: int = 5
    subgraph_every: int = 10


@dataclass
class ThreadLayout:
    """What was written for one thread (ids in write order, oldest first)."""

    plan: ThreadPlan
    root_ids: list[str] = field(default_factory=list)
    subgraph: list[tuple[str, str]] = field(default_factory=list)  # (ns, checkpoint_id)
    run_ids: list[str] = field(default_factory=list)


@dataclass
class ScaleInfo:
    """A built database: its spec, its counts and the threads a benchmark needs."""

    spec: ScaleSpec
    counts: dict[str, int]
    long_threads: dict[int, list[str]]  # steps -> thread ids
    sample_threads: list[str]  # ordinary threads
    build_seconds: float

    def run_ids(self, thread_id: str, steps_per_run: int | None = None) -> list[str]:
        """The run ids the builder gave ``thread_id`` (oldest first)."""
        steps = self._steps(thread_id)
        per = steps_per_run or self.spec.steps_per_run
        return [f"{thread_id}:run-{n}" for n in range((steps + per - 1) // per)]

    def _steps(self, thread_id: str) -> int:
        for steps, ids in self.long_threads.items():
            if thread_id in ids:
                return steps
        return self.spec.thread_steps


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def _checkpoint_id(tick: int, salt: str) -> str:
    # Sorts by time like LangGraph's uuid6 ids: a 64-bit tick, then a per-thread salt.
    t = f"{tick:016x}"
    return f"{t[:8]}-{t[8:12]}-6{t[12:15]}-8{t[15]}{salt[:2]}-{salt}"


def _version(step: int, salt: str) -> str:
    return f"{step:032}.0.{salt}"


def _bytea(data: bytes) -> str:
    return "\\\\x" + data.hex()


class Loader:
    """Three COPY streams (checkpoints, blobs, writes) on three connections, one
    transaction each; committed on a clean exit, rolled back on an error."""

    def __init__(self, dsn: str, message_bytes: int = 1200) -> None:
        self._dsn = dsn
        self.tick = 1 << 40
        msg = "x" * max(1, message_bytes - 60)
        self._messages = [
            _SERDE.dumps_typed([{"role": "user", "content": f"{i}:{msg}"}]) for i in range(8)
        ]
        self._write_value = _SERDE.dumps_typed({"role": "ai", "content": "ok"})
        self._trigger = _SERDE.dumps_typed(None)
        self.counts = {"checkpoints": 0, "checkpoint_blobs": 0, "checkpoint_writes": 0}

    def __enter__(self) -> Loader:
        self._conns = [psycopg.connect(self._dsn) for _ in range(3)]
        specs = [
            "COPY checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,"
            " checkpoint, metadata) FROM STDIN",
            "COPY checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)"
            " FROM STDIN",
            "COPY checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id,"
            " task_path, idx, channel, type, blob) FROM STDIN",
        ]
        self._stack = ExitStack()
        self._copies = [
            self._stack.enter_context(conn.cursor().copy(sql))
            for conn, sql in zip(self._conns, specs, strict=True)
        ]
        self._buffers: list[list[str]] = [[], [], []]
        self._sizes = [0, 0, 0]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                for i in range(3):
                    self._flush(i)
            self._stack.__exit__(exc_type, exc, tb)
            for conn in self._conns:
                if exc is None:
                    conn.commit()
                else:
                    conn.rollback()
        finally:
            for conn in self._conns:
                conn.close()

    def _emit(self, stream: int, line: str) -> None:
        self._buffers[stream].append(line)
        self._sizes[stream] += len(line)
        if self._sizes[stream] >= _CHUNK:
            self._flush(stream)

    def _flush(self, stream: int) -> None:
        if self._buffers[stream]:
            self._copies[stream].write("".join(self._buffers[stream]))
            self._buffers[stream].clear()
            self._sizes[stream] = 0

    # -- rows ----------------------------------------------------------------------

    def checkpoint(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        parent_id: str | None,
        checkpoint: dict[str, Any],
        metadata: dict[str, Any],
    ) -> None:
        self._emit(
            0,
            f"{thread_id}\t{ns}\t{checkpoint_id}\t{parent_id or chr(92) + 'N'}\t"
            f"{json.dumps(checkpoint, separators=(',', ':'))}\t"
            f"{json.dumps(metadata, separators=(',', ':'))}\n",
        )
        self.counts["checkpoints"] += 1

    def blob(
        self, thread_id: str, ns: str, channel: str, version: str, type_: str, blob: bytes
    ) -> None:
        self._emit(1, f"{thread_id}\t{ns}\t{channel}\t{version}\t{type_}\t{_bytea(blob)}\n")
        self.counts["checkpoint_blobs"] += 1

    def write(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        idx: int,
        channel: str,
        type_: str,
        blob: bytes,
    ) -> None:
        self._emit(
            2,
            f"{thread_id}\t{ns}\t{checkpoint_id}\t{task_id}\t{task_path}\t{idx}\t{channel}\t"
            f"{type_}\t{_bytea(blob)}\n",
        )
        self.counts["checkpoint_writes"] += 1

    def step(
        self,
        layout: ThreadLayout,
        step: int,
        *,
        ns: str = "",
        writes: int = 2,
        source: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """One checkpoint of a thread (the next in time), its blob and pending writes,
        continuing the namespace's previous checkpoint. Returns its id."""
        plan = layout.plan
        self.tick += 1
        salt = _digest(plan.thread_id + ns)
        cid = _checkpoint_id(self.tick, salt)
        ids = layout.root_ids if ns == "" else [c for n, c in layout.subgraph if n == ns]
        parent = ids[-1] if ids else None
        version = _version(step + 1, salt)
        start = _version(1, salt)
        checkpoint = {
            "v": 4,
            "id": cid,
            "ts": f"2026-01-01T00:00:00.{self.tick % 1000000:06d}+00:00",
            "channel_values": {"step_count": step},
            "channel_versions": {"__start__": start, "messages": version, "step_count": version},
            "versions_seen": {"__input__": {}, "agent": {"messages": version}},
            "updated_channels": ["messages", "step_count"],
        }
        if source is None:
            source = "input" if step == 0 else "loop"
        metadata: dict[str, Any] = {"source": source, "step": step - 1, "parents": {}}
        if run_id is not None:
            metadata["run_id"] = run_id
        self.checkpoint(plan.thread_id, ns, cid, parent, checkpoint, metadata)
        type_, blob = self._messages[step % len(self._messages)]
        self.blob(plan.thread_id, ns, "messages", version, type_, blob)
        if step == 0:
            self.blob(plan.thread_id, ns, "__start__", start, *self._trigger)
        for idx in range(writes):
            task = f"{salt}-{step:06d}"
            if idx == 0:
                self.write(plan.thread_id, ns, cid, task, "~__pregel_pull, agent", idx,
                           "messages", *self._write_value)  # fmt: skip
            else:
                self.write(plan.thread_id, ns, cid, task, "~__pregel_pull, agent", idx,
                           "branch:to:agent", *self._trigger)  # fmt: skip
        if ns == "":
            layout.root_ids.append(cid)
        else:
            layout.subgraph.append((ns, cid))
        return cid

    def thread(self, plan: ThreadPlan, writes: int = 2) -> ThreadLayout:
        """A whole thread at once (consecutive in time)."""
        layout = ThreadLayout(plan)
        for step in range(plan.steps):
            self.plan_step(layout, step, writes)
        return layout

    def plan_step(self, layout: ThreadLayout, step: int, writes: int = 2) -> None:
        plan = layout.plan
        run_id = None
        if plan.run_prefix is not None:
            run_id = f"{plan.run_prefix}-{step // plan.steps_per_run}"
            if not layout.run_ids or layout.run_ids[-1] != run_id:
                layout.run_ids.append(run_id)
        source = "input" if step % plan.steps_per_run == 0 else "loop"
        self.step(layout, step, writes=writes, source=source, run_id=run_id)
        if plan.subgraph_every and step % plan.subgraph_every == plan.subgraph_every - 1:
            # A subgraph's namespace names its node and task: new for every invocation.
            ns = f"inner:{_digest(plan.thread_id)}-{step // plan.subgraph_every:05d}"
            self.step(layout, step, ns=ns, writes=writes,
                      source="loop", run_id=run_id)  # fmt: skip


def default_plans(spec: ScaleSpec) -> list[ThreadPlan]:
    """The threads of ``spec``: the long ones first, then ordinary ones up to the count."""
    plans: list[ThreadPlan] = []
    per_step = 1 + 1 / spec.subgraph_every if spec.subgraph_every else 1.0
    budget = spec.checkpoints
    for steps, how_many in spec.long_threads:
        for i in range(how_many):
            tid = f"long-{steps}-{i}"
            plans.append(ThreadPlan(tid, steps, f"{tid}:run", spec.steps_per_run,
                                    spec.subgraph_every))  # fmt: skip
            budget -= int(steps * per_step)
    n = 0
    while budget > 0:
        tid = f"thread-{n:07d}"
        plans.append(ThreadPlan(tid, spec.thread_steps, f"{tid}:run", spec.steps_per_run,
                                spec.subgraph_every))  # fmt: skip
        budget -= int(spec.thread_steps * per_step)
        n += 1
    return plans


def _interleaved(plans: list[ThreadPlan]) -> Iterator[tuple[int, int]]:
    """(plan index, step) in time order: each thread's steps spread evenly over the
    whole timeline, so threads interleave as concurrent conversations do."""
    total = sum(p.steps for p in plans)
    heap = [(i * total / len(plans) / max(1, p.steps), i, 0) for i, p in enumerate(plans)]
    heapq.heapify(heap)
    while heap:
        at, i, step = heapq.heappop(heap)
        yield i, step
        if step + 1 < plans[i].steps:
            heapq.heappush(heap, (at + total / plans[i].steps, i, step + 1))


def build(
    dsn: str,
    spec: ScaleSpec = ScaleSpec(),
    *,
    plans: Iterable[ThreadPlan] = (),
    after_thread: Callable[[ThreadLayout, Loader], None] | None = None,
    progress: Callable[[str], None] = print,
) -> ScaleInfo:
    """Create the peer's schema (its own setup()) in the empty database ``dsn`` and load
    ``spec``'s threads (plus ``plans``). Refuses a database that has checkpoints."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM checkpoints) AS busy").fetchone()
        if row is not None and row["busy"]:
            raise RuntimeError(f"{dsn}: checkpoints is not empty; build into an empty database")
    all_plans = default_plans(spec) + list(plans)
    layouts = [ThreadLayout(p) for p in all_plans]
    with Loader(dsn, spec.message_bytes) as load:
        for done, (i, step) in enumerate(_interleaved(all_plans), 1):
            load.plan_step(layouts[i], step, spec.writes_per_checkpoint)
            if after_thread is not None and step == all_plans[i].steps - 1:
                after_thread(layouts[i], load)
            if done % 200_000 == 0:
                progress(f"  {load.counts['checkpoints']:,} checkpoints copied "
                         f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
        counts = dict(load.counts)
    progress(f"  copied {counts} in {time.perf_counter() - t0:.0f} s; vacuum analyze ...")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            conn.execute(f"VACUUM (ANALYZE) {table}")
    long_threads: dict[int, list[str]] = {}
    for p in all_plans:
        if p.thread_id.startswith("long-"):
            long_threads.setdefault(p.steps, []).append(p.thread_id)
    info = ScaleInfo(
        spec=spec,
        counts=counts,
        long_threads=long_threads,
        sample_threads=[p.thread_id for p in all_plans if p.thread_id.startswith("thread-")][:100],
        build_seconds=time.perf_counter() - t0,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {INFO_TABLE} (spec TEXT PRIMARY KEY, info JSONB)")
        conn.execute(
            f"INSERT INTO {INFO_TABLE} VALUES (%s, %s)",
            (spec.key(), psycopg.types.json.Jsonb(_info_json(info))),
        )
    progress(f"  built in {info.build_seconds:.0f} s")
    return info


def _info_json(info: ScaleInfo) -> dict[str, Any]:
    return {
        "counts": info.counts,
        "long_threads": {str(k): v for k, v in info.long_threads.items()},
        "sample_threads": info.sample_threads,
        "build_seconds": info.build_seconds,
    }


def load_info(dsn: str, spec: ScaleSpec) -> ScaleInfo | None:
    """The info a previous :func:`build` of ``spec`` left in ``dsn``, or None."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (INFO_TABLE,)).fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute(f"SELECT info FROM {INFO_TABLE} WHERE spec = %s", (spec.key(),))
        found = row.fetchone()
    if found is None:
        return None
    data = found[0]
    return ScaleInfo(
        spec=spec,
        counts=data["counts"],
        long_threads={int(k): v for k, v in data["long_threads"].items()},
        sample_threads=data["sample_threads"],
        build_seconds=data["build_seconds"],
    )


def ensure(dsn: str, spec: ScaleSpec = ScaleSpec(), **kwargs: Any) -> ScaleInfo:
    """:func:`load_info` if ``dsn`` already holds ``spec``, else :func:`build` it."""
    return load_info(dsn, spec) or build(dsn, spec, **kwargs)


def ensure_database(admin_dsn: str, dbname: str) -> str:
    """DSN of database ``dbname`` on ``admin_dsn``'s server, created if missing."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,))
        if found.fetchone() is None:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname))
            )
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)
