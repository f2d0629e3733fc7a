"""``langgraph-deterministic demo --restate``: parallel nodes on Restate, replayed.

One graph fans out to 4 parallel nodes; each makes 2 durable calls (the handler's own
``ctx.run_typed``) after non-durable work of random length, as an API or LLM call would.
A real restate-server, started here on free loopback ports with forced replay (the
service suspends after every durable step, so the handler replays from the journal each
time), invokes it several times as plain LangGraph (``graph.ainvoke``) and several times
under ``DeterministicRunner(journal=RestateJournal(ctx))``. The service is served in this
process (hypercorn) so that side effects can be counted exactly.

restate-server is found at ``$RESTATE_SERVER``, as ``restate-server`` on PATH, or in a
``.cache/restate-server`` npm prefix (``$LGD_CACHE_DIR/restate-server``, or the working
directory or one of its parents: where the tests put it). When it, or a package of the
``restate`` extra, is missing, the demo names every missing piece in one message with one
command that gets them all, and exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_deterministic.demos._restate_local import (
    RESTATE_VERSION,
    LocalRestate,
    RestateDemoError,
    RestateServerNotFoundError,
    free_port,
    http,
    locate_restate_server,
    missing_demo_pieces,
)

__all__ = [
    "RESTATE_VERSION",
    "RestateDemoError",
    "RestateServerNotFoundError",
    "locate_restate_server",
    "run_restate_demo",
]

TOPICS = ("tides", "moons", "orbits", "comets")
STEPS = ("search", "summarise")
OPS = [f"{t}.{s}" for t in TOPICS for s in STEPS]
INVOCATIONS = 3  # per side, all in flight at once
HANG_AFTER = 10.0  # seconds without a result or a failure: reported as a hang
SIDES = {"plain": "plain LangGraph", "deterministic": "DeterministicRunner"}
SCENARIO = (
    f"Scenario: a LangGraph graph fans out to {len(TOPICS)} parallel nodes, each making "
    f"{len(STEPS)} durable calls (ctx.run_typed) in a Restate handler, on a real "
    "restate-server with and without forced replay; per regime, "
    f"{INVOCATIONS} invocations as plain LangGraph (graph.ainvoke) beside {INVOCATIONS} "
    "under DeterministicRunner. Same graph, same server."
)


# -- the graph and the service ----------------------------------------------------------

_RUNS: dict[str, Counter[str]] = {}  # invocation key -> side effect -> executions


class State(TypedDict, total=False):
    key: str
    notes: Annotated[list[str], operator.add]


async def side_effect(key: str, op: str) -> str:
    """Stands in for an API or LLM call; counts how often it really ran."""
    await asyncio.sleep(random.random() * 0.03)
    _RUNS.setdefault(key, Counter())[op] += 1
    return f"{op}:ok"


def build_graph() -> Any:
    import restate

    def research(topic: str) -> Any:
        async def node(state: State, config: RunnableConfig) -> State:
            ctx = config["configurable"]["restate_ctx"]  # the handler's own context
            notes = []
            for step in STEPS:
                await asyncio.sleep(random.random() * 0.02)  # non-durable work, random length
                notes.append(
                    await ctx.run_typed(
                        step, side_effect, restate.RunOptions(), state["key"], f"{topic}.{step}"
                    )
                )
            return {"notes": notes}

        return node

    graph = StateGraph(State)
    for topic in TOPICS:
        graph.add_node(topic, research(topic))
        graph.add_edge(START, topic)
        graph.add_edge(topic, END)
    return graph.compile()


def build_app() -> Any:
    import restate

    from langgraph_deterministic.runner import DeterministicRunner, RestateJournal

    graph = build_graph()
    svc = restate.Service("LgdDemo")

    def output(out: dict[str, Any]) -> dict[str, Any]:
        return {"notes": sorted(out.get("notes", []))}

    @svc.handler()
    async def plain(ctx: Any, req: dict[str, Any]) -> dict[str, Any]:
        config: RunnableConfig = {"configurable": {"restate_ctx": ctx}}
        return output(await graph.ainvoke({"key": req["key"], "notes": []}, config))

    @svc.handler()
    async def deterministic(ctx: Any, req: dict[str, Any]) -> dict[str, Any]:
        config: RunnableConfig = {"configurable": {"restate_ctx": ctx}}
        runner = DeterministicRunner(journal=RestateJournal(ctx))
        return output(await runner.ainvoke(graph, {"key": req["key"], "notes": []}, config))

    return restate.app(services=[svc])


# -- running it -------------------------------------------------------------------------

REGIMES = {
    True: "forced replay: suspend + replay from the journal after every durable step",
    False: "no forced replay: one attempt, the branches' calls in flight together",
}


@dataclass
class Outcome:
    forced_replay: bool
    side: str
    key: str
    invocation_id: str
    status: str = "hang"  # ok | mismatch | hang | failed
    detail: str = ""
    runs: Counter[str] = field(default_factory=Counter)


def _classify(row: dict[str, Any]) -> tuple[str, str] | None:
    """(status, detail) once an invocation has an outcome, else None (still running)."""
    failure = str(row.get("last_failure") or "")
    if row.get("last_failure_error_code") == 570 or "570" in failure:
        return "mismatch", failure
    if row.get("status") == "completed":
        if row.get("completion_result") == "success":
            return "ok", ""
        return "failed", str(row.get("completion_failure"))
    if row.get("last_failure_error_code") is not None or failure:
        return "failed", failure
    return None


async def _invoke_all(servers: list[LocalRestate]) -> list[Outcome]:
    outcomes = []
    for server in servers:
        for side in SIDES:
            for _ in range(INVOCATIONS):
                key = uuid.uuid4().hex
                status, body = await asyncio.to_thread(
                    http, "POST", f"{server.ingress}/LgdDemo/{side}/send", {"key": key}
                )
                if status >= 300 or not isinstance(body, dict):
                    raise RestateDemoError(f"invoking LgdDemo/{side} failed: {status} {body}")
                outcomes.append(Outcome(server.forced_replay, side, key, str(body["invocationId"])))
    return outcomes


async def _settle(server: LocalRestate, outcomes: list[Outcome], deadline: float) -> None:
    """Poll until every invocation finished or failed, or the deadline (a hang)."""
    pending = {o.invocation_id: o for o in outcomes}
    expected = {"notes": sorted(f"{op}:ok" for op in OPS)}
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        ids = ", ".join(f"'{i}'" for i in pending)
        rows = await asyncio.to_thread(
            server.query,
            "select id, status, last_failure, last_failure_error_code, completion_result, "
            f"completion_failure from sys_invocation where id in ({ids})",
        )
        for row in rows:
            verdict = _classify(row)
            if verdict is None:
                continue
            outcome = pending.pop(row["id"])
            outcome.status, outcome.detail = verdict
            if outcome.status == "ok":
                code, out = await asyncio.to_thread(
                    http, "GET", f"{server.ingress}/restate/invocation/{row['id']}/output"
                )
                if code != 200 or out != expected:
                    outcome.status, outcome.detail = "failed", f"wrong result: {code} {out}"
    for outcome in outcomes:  # hung, or retrying after a failure: stop Restate retrying
        if outcome.status != "ok":
            await asyncio.to_thread(server.kill_invocation, outcome.invocation_id)


async def _serve_and_drive(servers: list[LocalRestate], log: Path) -> list[Outcome]:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 0
    config.accesslog = None
    config.errorlog = str(log)
    loop = asyncio.get_running_loop()

    def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Python 3.11's streams log a connection task cancelled at shutdown as an error
        if not isinstance(context.get("exception"), asyncio.CancelledError):
            loop.default_exception_handler(context)

    loop.set_exception_handler(on_loop_error)
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build_app(), config, shutdown_trigger=stop.wait))
    try:
        deadline = time.monotonic() + 15
        while not await asyncio.to_thread(_listening, port):
            if service.done() or time.monotonic() > deadline:
                raise RestateDemoError(f"the demo's service did not start listening (log: {log})")
            await asyncio.sleep(0.05)
        for server in servers:  # one in-process service, registered with both servers
            await asyncio.to_thread(server.register, f"http://127.0.0.1:{port}")
        outcomes = await _invoke_all(servers)
        deadline = time.monotonic() + HANG_AFTER
        await asyncio.gather(
            *(
                _settle(s, [o for o in outcomes if o.forced_replay == s.forced_replay], deadline)
                for s in servers
            )
        )
        await asyncio.sleep(0.2)  # let killed attempts wind down before counting
        for outcome in outcomes:
            outcome.runs = _RUNS.pop(outcome.key, Counter())
        return outcomes
    finally:
        # restate-server first: it closes its connections, then the service stops idle
        for server in servers:
            await asyncio.to_thread(server.stop)
        stop.set()
        try:
            await asyncio.wait_for(service, timeout=5)
        except (TimeoutError, asyncio.CancelledError):
            service.cancel()
            with contextlib.suppress(BaseException):
                await service


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def _quiet_sdk() -> Iterator[None]:
    """The SDK logs every journal mismatch of the plain side with a traceback: the table
    says it once."""
    import logging

    loggers = [logging.getLogger(n) for n in ("restate", "hypercorn.error")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def table(outcomes: list[Outcome]) -> dict[str, dict[str, str]]:
    """Per side (column), per measure (row), for the outcomes of one regime."""
    rows: dict[str, dict[str, str]] = {}
    for side, label in SIDES.items():
        mine = [o for o in outcomes if o.side == side]
        counts = Counter(o.status for o in mine)
        per_op = [o.runs.get(op, 0) for o in mine for op in OPS]
        low, high = min(per_op), max(per_op)
        rows[label] = {
            "finished, right result": f"{counts['ok']} of {len(mine)}",
            "570 journal mismatch": str(counts["mismatch"]),
            f"hang (nothing in {HANG_AFTER:.0f} s)": str(counts["hang"]),
            "other failure": str(counts["failed"]),
            "runs of each side effect": str(low) if low == high else f"{low} to {high}",
            "side effects run twice+": str(sum(n > 1 for n in per_op)),
            "side effects never run": str(sum(n == 0 for n in per_op)),
        }
    return rows


def _print_table(title: str, rows: dict[str, dict[str, str]]) -> None:
    print(f"\n== {title} ==")
    print(f"{'':28}" + "".join(f"{label:>22}" for label in rows))
    for key in next(iter(rows.values())):
        print(f"{key:28}" + "".join(f"{r[key]:>22}" for r in rows.values()))


def run_restate_demo() -> int:
    """The demo; 0 when every DeterministicRunner invocation finished with each side
    effect run once and no journal mismatch, 1 otherwise, 2 when restate-server or the
    ``restate`` extra is missing."""
    try:
        missing = missing_demo_pieces()  # every missing piece in one message
        binary = locate_restate_server() if missing is None else None
    except RestateServerNotFoundError as exc:  # $RESTATE_SERVER names no binary
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if binary is None:
        print(f"error: {missing}", file=sys.stderr)
        return 2

    print(SCENARIO, flush=True)
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.strip()
    print(f"restate-server: {binary} ({version or 'version unknown'})", flush=True)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # run the finally below: stop restate-server

    if in_main:
        signal.signal(signal.SIGTERM, on_sigterm)
    servers = [LocalRestate(binary, forced_replay=forced) for forced in REGIMES]
    log = Path(tempfile.mkstemp(prefix="lgd-demo-service-", suffix=".log")[1])
    t0 = time.monotonic()
    try:
        for server in servers:
            server.start()
        with _quiet_sdk():
            outcomes = asyncio.run(_serve_and_drive(servers, log))
    except RestateDemoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server.stop()
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    elapsed = time.monotonic() - t0
    log.unlink(missing_ok=True)

    for forced, title in REGIMES.items():
        _print_table(title, table([o for o in outcomes if o.forced_replay == forced]))
    plain_failure = next((o for o in outcomes if o.side == "plain" and o.detail), None)
    if plain_failure is not None:
        print(f"\nplain LangGraph, e.g.: {plain_failure.detail.splitlines()[0][:160]}")
    ours = [o for o in outcomes if o.side == "deterministic"]
    ok = all(o.status == "ok" and all(o.runs.get(op) == 1 for op in OPS) for o in ours)
    print(
        f"\nDeterministicRunner: {len(ours)} of {len(ours)} invocations finished without a "
        f"journal mismatch or a hang, each side effect ran once ({elapsed:.1f} s)."
        if ok
        else "\nUNEXPECTED: DeterministicRunner's invocations did not all finish cleanly: "
        + "; ".join(f"{o.status} {o.detail[:200]} {dict(o.runs)}" for o in ours if o.status != "ok")
    )
    return 0 if ok else 1
