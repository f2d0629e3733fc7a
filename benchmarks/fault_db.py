"""A PostgresSaver-layout checkpoint database with planted faults, for audit and repair.

Every thread is a conversation of the agent in ``langgraph_deterministic.demos.support_agent`` (nodes
``agent`` and ``tools``, a ``messages`` channel) in the exact layout LangGraph 1.2 writes
through PostgresSaver: five checkpoints per run (input, then agent / tools / agent /
finished), channel versions in the peer's format, ``branch:to:<node>`` triggers inline in
``channel_values``, the ``__start__`` task's writes on each input checkpoint. So a real
graph can continue any of these threads, which is how the repair test proves a repaired
thread usable.

Only the blobs and writes the saver loads for a thread's head (its messages) and for its
input checkpoints are generated; history blobs are not (a real database has one messages
blob per step: the audit never reads them, it looks blobs up by key).

``build(dsn, threads=..., planted=...)`` fills an empty database with COPY and returns the
ground truth: ``{thread_id: expected fault classes}``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

# kind -> the fault classes audit must report for a thread of that kind
KINDS: dict[str, frozenset[str]] = {
    "clean": frozenset(),
    "no_run_id": frozenset({"no_run_id"}),
    "reapplied": frozenset(
        {"reapplied_input", "unanswered_tool_call", "unfinished_step", "no_run_id"}
    ),
    "orphan": frozenset({"unanswered_tool_call"}),
    "unfinished": frozenset({"unfinished_step"}),
    "unfinished_run": frozenset({"unfinished_step", "unfinished_run"}),
    "fork": frozenset({"forked_history"}),
    # negative controls: look like damage to a careless scan, are not
    "interrupted": frozenset(),  # waiting on a human (an __interrupt__ write)
    "active": frozenset(),  # a step left, but written a moment ago: a worker runs it
    "repeat_user": frozenset(),  # the user sent the same message twice, both answered
}
LEDGER_KINDS = {"unfinished_run"}

_SERDE = JsonPlusSerializer()
_EPOCH = datetime(2026, 11, 1, tzinfo=UTC)


def _v(n: int) -> str:
    return f"{n:032}.0.{(n * 7919) % 10**16:016}"


@dataclass
class _Thread:
    thread_id: str
    run_ids: bool
    ts: datetime
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    writes: list[tuple[Any, ...]] = field(default_factory=list)
    messages: list[AnyMessage] = field(default_factory=list)
    cv: dict[str, str] = field(default_factory=dict)
    vs: dict[str, dict[str, str]] = field(default_factory=lambda: {"__input__": {}})
    counter: int = 0
    step: int = -1
    head: str = ""
    run: str | None = None

    def _next(self) -> str:
        self.counter += 1
        return _v(self.counter)

    def _cp_id(self) -> str:
        """A uuid6 for ``self.ts``, laid out as LangGraph's ids are, so ids sort by time
        and every id a saver mints today sorts after the generated ones."""
        self.ts += timedelta(milliseconds=250)
        ticks = int(self.ts.timestamp() * 10_000_000) + 0x01B21DD213814000
        seq = 0x8000 | (self.counter & 0x3FFF)
        return (
            f"{ticks >> 28:08x}-{(ticks >> 12) & 0xFFFF:04x}-6{ticks & 0xFFF:03x}-"
            f"{seq:04x}-{self.counter:012x}"
        )

    def put(self, source: str, values: dict[str, Any], parent: str | None = None) -> str:
        cp_id = self._cp_id()
        checkpoint = {
            "v": 4, "id": cp_id, "ts": self.ts.isoformat(),
            "channel_versions": dict(self.cv),
            "versions_seen": json.loads(json.dumps(self.vs)),
            "channel_values": values,
            "updated_channels": None,
        }  # fmt: skip
        metadata: dict[str, Any] = {"source": source, "step": self.step, "parents": {}}
        if self.run_ids and self.run is not None:
            metadata["run_id"] = self.run
        parent_id = self.head if parent is None else parent
        self.rows.append(
            (self.thread_id, "", cp_id, parent_id or None, json.dumps(checkpoint), json.dumps(metadata))
        )
        self.head = cp_id
        self.step += 1
        return cp_id

    def user(self, text: str, run: str) -> None:
        self.run = run
        self.cv["__start__"] = self._next()
        cp = self.put("input", {})
        start = [HumanMessage(content=text)]
        t, b = _SERDE.dumps_typed(start)
        task = f"start-{cp[-12:]}"
        self.writes.append((self.thread_id, "", cp, task, "~__pregel_pull, __start__", 0, "messages", t, b))
        self.writes.append((self.thread_id, "", cp, task, "~__pregel_pull, __start__", 1, "branch:to:agent", "null", b""))
        self.vs.setdefault("__start__", {})["__start__"] = self.cv["__start__"]
        v = self._next()
        self.messages = [*self.messages, HumanMessage(content=text, id=f"h{self.counter}")]
        self.cv.update({"messages": v, "__start__": v, "branch:to:agent": v})
        self.put("loop", {"branch:to:agent": None})

    def agent_calls_tool(self, call_id: str) -> None:
        self.vs.setdefault("agent", {})["branch:to:agent"] = self.cv["branch:to:agent"]
        v = self._next()
        self.messages = [*self.messages, AIMessage(content="", id=f"a{self.counter}", tool_calls=[
            {"name": "refund", "args": {"order_id": "A-1001"}, "id": call_id}])]  # fmt: skip
        self.cv.update({"messages": v, "branch:to:agent": v, "branch:to:tools": v})
        self.put("loop", {"branch:to:tools": None})

    def tools_answer(self, call_id: str) -> None:
        self.vs.setdefault("tools", {})["branch:to:tools"] = self.cv["branch:to:tools"]
        v = self._next()
        self.messages = [*self.messages, ToolMessage(content="refunded A-1001", tool_call_id=call_id, id=f"t{self.counter}")]  # fmt: skip
        self.cv.update({"messages": v, "branch:to:tools": v, "branch:to:agent": v})
        self.put("loop", {"branch:to:agent": None})

    def agent_answers(self, text: str = "Done: refunded A-1001") -> None:
        self.vs.setdefault("agent", {})["branch:to:agent"] = self.cv["branch:to:agent"]
        v = self._next()
        self.messages = [*self.messages, AIMessage(content=text, id=f"b{self.counter}")]
        self.cv.update({"messages": v, "branch:to:agent": v})
        self.put("loop", {})

    def full_run(self, n: int, text: str = "Please refund order A-1001") -> None:
        call = f"call-{n}"
        self.user(text, f"{self.thread_id}:run-{n}")
        self.agent_calls_tool(call)
        self.tools_answer(call)
        self.agent_answers()

    def head_blob(self) -> tuple[Any, ...]:
        t, b = _SERDE.dumps_typed(self.messages)
        return (self.thread_id, "", "messages", self.cv["messages"], t, b)


def make_thread(thread_id: str, kind: str, runs: int, now: datetime) -> _Thread:
    t = _Thread(thread_id, run_ids=kind not in ("no_run_id", "reapplied"), ts=_EPOCH)
    for n in range(runs - 1):
        t.full_run(n)
    last = runs - 1
    if kind in ("clean", "no_run_id", "fork", "repeat_user"):
        if kind == "fork":
            # two attempts of the last run continued its tools step at once: the loser's
            # two checkpoints stay behind as a dead branch
            t.user("Please refund order A-1001", f"{thread_id}:run-{last}")
            t.agent_calls_tool(f"call-{last}")
            saved = (t.head, dict(t.cv), json.loads(json.dumps(t.vs)), list(t.messages), t.counter, t.step)
            t.tools_answer(f"call-{last}")
            t.agent_answers()
            head, cv, vs, messages, counter, step = saved
            keep = (t.head, dict(t.cv), json.loads(json.dumps(t.vs)), list(t.messages), t.counter, t.step)
            t.head, t.cv, t.vs, t.messages, t.counter, t.step = head, cv, vs, messages, counter + 100, step
            t.tools_answer(f"call-{last}")
            t.agent_answers()
            t.head, t.cv, t.vs, t.messages, t.counter, t.step = keep
            t.counter += 200
            t.ts += timedelta(seconds=1)
            t.full_run(last + 1)  # the thread went on from the branch that won
        elif kind == "repeat_user":
            t.full_run(last, "Please refund order A-1001")  # the same text as every run
        else:
            t.full_run(last)
    elif kind == "orphan":
        t.user("Please refund order A-1001", f"{thread_id}:run-{last}")
        t.agent_calls_tool(f"call-{last}")
        t.agent_answers("I could not reach the refund tool.")  # a graph bug: tools skipped
        t.full_run(last + 1, "Then please just refund it")
    elif kind in ("unfinished", "unfinished_run", "interrupted", "active"):
        t.user("Please refund order A-1001", f"{thread_id}:run-{last}")
        if kind == "active":
            t.ts = now - timedelta(seconds=5)
        t.agent_calls_tool(f"call-{last}")  # the worker dies in the tool: tools pending
        if kind == "interrupted":
            t.writes.append((thread_id, "", t.head, "tools-task", "~__pregel_pull, tools",
                             -3, "__interrupt__", *_SERDE.dumps_typed([{"value": "approve?"}])))  # fmt: skip
    elif kind == "reapplied":
        t.user("Please refund order A-1001", f"{thread_id}:run-{last}")
        t.agent_calls_tool(f"call-{last}")  # killed in the tool...
        t.user("Please refund order A-1001", f"{thread_id}:run-{last}")  # ...retried: input again
        err = _SERDE.dumps_typed(ValueError("400 Bad Request: tool_use without tool_result"))
        t.writes.append((thread_id, "", t.head, "agent-task", "~__pregel_pull, agent", -1, "__error__", *err))
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return t


def plan(threads: int, planted: int, seed: int = 7) -> list[tuple[str, str]]:
    """(thread_id, kind) for every thread: ``planted`` threads of each non-clean kind."""
    kinds = [k for k in KINDS if k != "clean"]
    rng = random.Random(seed)
    ids = [f"thread-{i:08d}" for i in range(threads)]
    chosen = rng.sample(range(threads), planted * len(kinds))
    kind_of = dict.fromkeys(range(threads), "clean")
    for j, i in enumerate(chosen):
        kind_of[i] = kinds[j % len(kinds)]
    return [(ids[i], kind_of[i]) for i in range(threads)]


def generate(
    layout: list[tuple[str, str]], runs: int, now: datetime
) -> Iterator[_Thread]:
    cache: dict[tuple[str, int], _Thread] = {}
    for thread_id, kind in layout:
        # all threads of a kind are alike but their ids: build one, rename the rows
        key = (kind, runs)
        if key not in cache:
            cache[key] = make_thread("T", kind, runs, now)
        tpl = cache[key]
        yield _renamed(tpl, thread_id)


def _renamed(tpl: _Thread, thread_id: str) -> _Thread:
    t = _Thread(thread_id, tpl.run_ids, tpl.ts)
    t.rows = [(thread_id, *r[1:4], r[4], r[5].replace('"T:run-', f'"{thread_id}:run-')) for r in tpl.rows]
    t.writes = [(thread_id, *w[1:]) for w in tpl.writes]
    t.messages, t.cv, t.head, t.run = tpl.messages, tpl.cv, tpl.head, tpl.run
    if t.run:
        t.run = t.run.replace("T:run-", f"{thread_id}:run-")
    return t


def build(
    dsn: str, *, threads: int, planted: int, runs: int = 8, ledger: bool = True, seed: int = 7
) -> dict[str, frozenset[str]]:
    """Fill the (empty) database at ``dsn``; returns {thread_id: expected faults}.

    ``ledger=False`` leaves our tables out (a pure PostgresSaver database) and plants no
    ``unfinished_run`` thread.
    """
    layout = plan(threads, planted, seed)
    if not ledger:
        layout = [(t, "unfinished" if k in LEDGER_KINDS else k) for t, k in layout]
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    if ledger:
        from langgraph_deterministic import DeterministicSaver

        with DeterministicSaver(dsn) as saver:
            saver.setup()
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(dsn) as peer:
            peer.setup()
    expected: dict[str, frozenset[str]] = {}
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
            with (
                cur.copy("COPY checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata) FROM STDIN") as cp,
            ):
                blobs: list[tuple[Any, ...]] = []
                writes: list[tuple[Any, ...]] = []
                runs_rows: list[tuple[Any, ...]] = []
                for (thread_id, kind), t in zip(layout, generate(layout, runs, now), strict=True):
                    expected[thread_id] = KINDS[kind]
                    for row in t.rows:
                        cp.write_row(row)
                    blobs.append(t.head_blob())
                    writes.extend(t.writes)
                    if kind in LEDGER_KINDS:
                        runs_rows.append((thread_id, t.run, "running", t.rows[-3][2], t.head))
            with cur.copy("COPY checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) FROM STDIN") as cp:
                for row in blobs:
                    cp.write_row(row)
            with cur.copy("COPY checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob) FROM STDIN") as cp:
                for row in writes:
                    cp.write_row(row)
            for row in runs_rows:
                cur.execute(
                    "INSERT INTO lgd_runs (thread_id, run_id, status, first_checkpoint_id, last_checkpoint_id) VALUES (%s, %s, %s, %s, %s)",
                    row,
                )
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE checkpoints")
        conn.execute("VACUUM ANALYZE checkpoint_blobs")
        conn.execute("VACUUM ANALYZE checkpoint_writes")
    return expected
