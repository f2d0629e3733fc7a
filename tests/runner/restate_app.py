"""The Restate service the end-to-end tests register (run by hypercorn in a subprocess).

Every handler takes ``{"effects": <file>, "gate": <file or null>, "seed": int}``. Side
effects append one line ``done <label>`` to the effects file when they finish (and
``start <label>`` when they begin), so a test can count how often each ran. A side effect
whose label is in ``{"slow": [...]}`` waits until the gate file exists before finishing
(the kill -9 test kills the service while one of them waits).
"""

from __future__ import annotations

import asyncio
import contextvars
import operator
import os
import random
import time
import uuid
from datetime import timedelta
from typing import Annotated, Any

import restate
from langchain.agents import create_agent
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt
from restate.ext.langchain import RestateMiddleware, restate_context
from typing_extensions import TypedDict

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.runner import (
    DeterministicRunner,
    NondeterminismError,
    RestateJournal,
    durable,
)

# -- side effects --------------------------------------------------------------------------

_REQ: dict[str, Any] = {}
#: the handler attempt a side effect ran in: one tag per call of a handler, so that a test
#: can tell "ran again in a later attempt" (at-least-once) from "ran twice in one attempt"
_ATTEMPT: contextvars.ContextVar[str] = contextvars.ContextVar("attempt", default="-")


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def effect(label: str, req: dict[str, Any]) -> str:
    """A side effect: takes a random while, records itself, returns a value."""
    _append(req["effects"], f"start {label}")
    _append(req["effects"], f"attempt {label} {_ATTEMPT.get()}")
    await asyncio.sleep(random.random() * 0.03)
    if label in req.get("slow", []):
        while not os.path.exists(req["gate"]):
            await asyncio.sleep(0.02)
    _append(req["effects"], f"done {label}")
    return f"{label}:ok"


async def jitter() -> None:
    """Non-durable work of random length before a durable op (what breaks naive replay)."""
    await asyncio.sleep(random.random() * 0.02)


# -- graph shapes --------------------------------------------------------------------------


class FanState(TypedDict, total=False):
    req: dict[str, Any]
    results: Annotated[list[str], operator.add]
    summary: str


def fanout_graph(width: int = 4) -> Any:
    async def plan(state: FanState) -> FanState:
        return {"results": [await durable("plan", effect, "plan", state["req"])]}

    def branch(i: int) -> Any:
        async def node(state: FanState) -> FanState:
            out = []
            for j in range(2):
                await jitter()
                out.append(await durable(f"op{j}", effect, f"b{i}.op{j}", state["req"]))
            return {"results": out}

        return node

    async def join(state: FanState) -> FanState:
        got = await durable("join", effect, "join", state["req"])
        return {"summary": f"{got}|{len(state['results'])}"}

    g = StateGraph(FanState)
    g.add_node("plan", plan)
    g.add_node("join", join)
    g.add_edge(START, "plan")
    for i in range(width):
        g.add_node(f"b{i}", branch(i))
        g.add_edge("plan", f"b{i}")
        g.add_edge(f"b{i}", "join")
    g.add_edge("join", END)
    return g.compile()


def fanout_ctx_graph(width: int = 4) -> Any:
    """Fan-out whose nodes call restate_context().run_typed as Restate's docs teach."""

    def branch(i: int) -> Any:
        async def node(state: FanState) -> FanState:
            ctx = restate_context()
            out = []
            for j in range(2):
                await jitter()
                out.append(
                    await ctx.run_typed(
                        f"op{j}", effect, restate.RunOptions(), f"b{i}.op{j}", state["req"]
                    )
                )
            return {"results": out}

        return node

    g = StateGraph(FanState)
    for i in range(width):
        g.add_node(f"b{i}", branch(i))
        g.add_edge(START, f"b{i}")
        g.add_edge(f"b{i}", END)
    return g.compile()


class MapState(TypedDict, total=False):
    req: dict[str, Any]
    items: list[int]
    results: Annotated[list[str], operator.add]
    summary: str


class ItemState(TypedDict):
    req: dict[str, Any]
    item: int


def mapreduce_graph(n: int = 5) -> Any:
    async def split(state: MapState) -> MapState:
        await durable("split", effect, "split", state["req"])
        return {"items": list(range(n))}

    def fan(state: MapState) -> list[Send]:
        return [Send("worker", {"req": state["req"], "item": i}) for i in state["items"]]

    async def worker(state: ItemState) -> MapState:
        i = state["item"]
        await jitter()
        a = await durable("fetch", effect, f"w{i}.fetch", state["req"])
        await jitter()
        b = await durable("store", effect, f"w{i}.store", state["req"])
        return {"results": [a, b]}

    async def reduce(state: MapState) -> MapState:
        got = await durable("reduce", effect, "reduce", state["req"])
        return {"summary": f"{got}|{len(state['results'])}"}

    g = StateGraph(MapState)
    g.add_node("split", split)
    g.add_node("worker", worker)
    g.add_node("reduce", reduce)
    g.add_edge(START, "split")
    g.add_conditional_edges("split", fan, ["worker"])
    g.add_edge("worker", "reduce")
    g.add_edge("reduce", END)
    return g.compile()


def nested_graph() -> Any:
    def inner(prefix: str) -> Any:
        def leaf(j: int) -> Any:
            async def node(state: FanState) -> FanState:
                await jitter()
                return {"results": [await durable("leaf", effect, f"{prefix}.l{j}", state["req"])]}

            return node

        g = StateGraph(FanState)
        for j in range(2):
            g.add_node(f"l{j}", leaf(j))
            g.add_edge(START, f"l{j}")
            g.add_edge(f"l{j}", END)
        return g.compile()

    subs = {p: inner(p) for p in ("s0", "s1")}

    def outer_node(prefix: str) -> Any:
        async def node(state: FanState) -> FanState:
            out = await subs[prefix].ainvoke({"req": state["req"], "results": []})
            await jitter()
            after = await durable("after", effect, f"{prefix}.after", state["req"])
            return {"results": [*out["results"], after]}

        return node

    async def join(state: FanState) -> FanState:
        return {"summary": f"{len(state['results'])}"}

    g = StateGraph(FanState)
    for p in subs:
        g.add_node(p, outer_node(p))
        g.add_edge(START, p)
        g.add_edge(p, "join")
    g.add_node("join", join)
    g.add_edge("join", END)
    return g.compile()


def gather_graph() -> Any:
    def node(i: int) -> Any:
        async def run(state: FanState) -> FanState:
            async def one(j: int) -> str:
                await jitter()
                return await durable(f"call{j}", effect, f"n{i}.c{j}", state["req"])

            got = await asyncio.gather(*(one(j) for j in range(3)))
            ctx = restate_context()  # unchanged Restate code inside a parallel node
            extra = await ctx.run_typed(
                "ctx-run", effect, restate.RunOptions(), f"n{i}.ctx", state["req"]
            )
            return {"results": [*got, extra]}

        return run

    g = StateGraph(FanState)
    for i in range(3):
        g.add_node(f"n{i}", node(i))
        g.add_edge(START, f"n{i}")
        g.add_edge(f"n{i}", END)
    return g.compile()


def combinators_graph() -> Any:
    async def with_gather(state: FanState) -> FanState:
        ctx = restate_context()
        f1 = ctx.run_typed("x", effect, restate.RunOptions(), "comb.x", state["req"])
        f2 = ctx.run_typed("y", effect, restate.RunOptions(), "comb.y", state["req"])
        await restate.gather(f1, f2)  # routed futures work with restate.gather
        out = [await f1, await f2]
        try:
            await restate.select(
                a=ctx.run_typed("sa", _sleep_op, restate.RunOptions(), 0.0),
                b=ctx.run_typed("sb", _sleep_op, restate.RunOptions(), 0.0),
            )
        except NondeterminismError as exc:
            out.append("select refused" if "restate.gather" in str(exc) else str(exc))
        return {"results": out}

    async def terminal(state: FanState) -> FanState:
        async def fail() -> str:
            _append(state["req"]["effects"], "done comb.fail")
            raise restate.TerminalError("nope", 422)

        await jitter()
        try:
            await durable("fail", fail)
        except restate.TerminalError as exc:
            return {"results": [f"caught {exc.message} {exc.status_code}"]}
        return {"results": ["not raised"]}

    g = StateGraph(FanState)
    for name, fn in (("with_gather", with_gather), ("terminal", terminal)):
        g.add_node(name, fn)
        g.add_edge(START, name)
        g.add_edge(name, END)
    return g.compile()


# -- create_agent with parallel tool calls -------------------------------------------------


class ScriptedChatModel(BaseChatModel):
    """Deterministic chat model: asks for three tools at once, then answers."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        if not any(isinstance(m, ToolMessage) for m in messages):
            human = next(m for m in messages if isinstance(m, HumanMessage))
            city = str(human.content)
            return AIMessage(
                content="",
                tool_calls=[
                    {"name": "weather", "args": {"city": city}, "id": f"call_weather_{city}"},
                    {"name": "population", "args": {"city": city}, "id": f"call_population_{city}"},
                    {"name": "timezone", "args": {"city": city}, "id": f"call_timezone_{city}"},
                ],
            )
        tools = sorted(str(m.content) for m in messages if isinstance(m, ToolMessage))
        return AIMessage(content=" / ".join(tools))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        await jitter()
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])


def _tool_effect(name: str, city: str) -> Any:
    async def call() -> str:
        return await effect(f"tool.{name}.{city}", _REQ["current"])

    return call


@tool
async def weather(city: str) -> str:
    """Weather in a city."""
    await jitter()
    return await restate_context().run_typed("weather", _tool_effect("weather", city))


@tool
async def population(city: str) -> str:
    """Population of a city."""
    await jitter()
    return await restate_context().run_typed("population", _tool_effect("population", city))


@tool
async def timezone(city: str) -> str:
    """Timezone of a city."""
    await jitter()
    return await restate_context().run_typed("timezone", _tool_effect("timezone", city))


def agent_graph() -> Any:
    agent = create_agent(
        ScriptedChatModel(), tools=[weather, population, timezone], middleware=[RestateMiddleware()]
    )

    async def ask(state: FanState) -> FanState:
        out = await agent.ainvoke({"messages": [HumanMessage("paris")]})
        return {"results": [str(out["messages"][-1].content)]}

    async def side(state: FanState) -> FanState:
        await jitter()
        return {"results": [await durable("side", effect, "side", state["req"])]}

    g = StateGraph(FanState)
    g.add_node("ask", ask)
    g.add_node("side", side)
    g.add_edge(START, "ask")
    g.add_edge(START, "side")
    g.add_edge("ask", END)
    g.add_edge("side", END)
    return g.compile()


def durable_agent_graph() -> Any:
    """The "agent" shape with DurableMiddleware (ops through durable()) instead of
    RestateMiddleware, and tools that do their side effect directly."""
    from langgraph_deterministic.runner import DurableMiddleware

    def plain(name: str) -> Any:
        async def run(city: str) -> str:
            await jitter()
            return await effect(f"tool.{name}.{city}", _REQ["current"])

        run.__name__ = name
        run.__doc__ = f"The {name} of a city."
        return tool(run)

    agent = create_agent(
        ScriptedChatModel(),
        tools=[plain("weather"), plain("population"), plain("timezone")],
        middleware=[DurableMiddleware()],
    )

    async def ask(state: FanState) -> FanState:
        out = await agent.ainvoke({"messages": [HumanMessage("paris")]})
        return {"results": [str(out["messages"][-1].content)]}

    async def side(state: FanState) -> FanState:
        await jitter()
        return {"results": [await durable("side", effect, "side", state["req"])]}

    g = StateGraph(FanState)
    g.add_node("ask", ask)
    g.add_node("side", side)
    g.add_edge(START, "ask")
    g.add_edge(START, "side")
    return g.compile()


def agents_graph() -> Any:
    """Two create_agent agents (RestateMiddleware, three parallel tool calls each) in
    parallel nodes: the middleware keeps per-turn state on the shared Restate context."""
    agent = create_agent(
        ScriptedChatModel(), tools=[weather, population, timezone], middleware=[RestateMiddleware()]
    )

    def ask(city: str) -> Any:
        async def node(state: FanState) -> FanState:
            await jitter()
            out = await agent.ainvoke({"messages": [HumanMessage(city)]})
            return {"results": [str(out["messages"][-1].content)]}

        return node

    g = StateGraph(FanState)
    for city in ("paris", "rome"):
        g.add_node(city, ask(city))
        g.add_edge(START, city)
        g.add_edge(city, END)
    return g.compile()


# -- the pair: DeterministicSaver on Postgres under DeterministicRunner -----------------------


class HitlState(TypedDict, total=False):
    topic: str
    results: Annotated[list[str], operator.add]
    approved: str
    summary: str


def _label(name: str) -> str:
    return f"t{_REQ['current'].get('turn', 0)}.{name}"


async def _effect_now(name: str) -> str:
    return await effect(_label(name), _REQ["current"])


def hitl_graph(checkpointer: Any) -> Any:
    """plan -> [research, sub (a parallel subgraph), approve (interrupts once)] -> join."""

    async def plan(state: HitlState) -> HitlState:
        return {"results": [await durable("plan", _effect_now, "plan")]}

    async def research(state: HitlState) -> HitlState:
        out = []
        for j in range(2):
            await jitter()
            out.append(await durable(f"op{j}", _effect_now, f"research.op{j}"))
        return {"results": out}

    def leaf(j: int) -> Any:
        async def node(state: HitlState) -> HitlState:
            await jitter()
            return {"results": [await durable("leaf", _effect_now, f"sub.l{j}")]}

        return node

    inner = StateGraph(HitlState)
    for j in range(2):
        inner.add_node(f"l{j}", leaf(j))
        inner.add_edge(START, f"l{j}")
        inner.add_edge(f"l{j}", END)
    inner_graph = inner.compile()

    async def sub(state: HitlState) -> HitlState:
        # A subgraph run by a node: it keeps its own checkpoints in the parent's saver.
        out = await inner_graph.ainvoke({"results": []})
        return {"results": out["results"]}

    async def approve(state: HitlState) -> HitlState:
        await jitter()
        answer = state.get("approved") or interrupt({"question": f"go ahead with {state['topic']}?"})
        got = await durable("act", _effect_now, f"act.{answer}")
        return {"results": [got], "approved": answer}

    async def join(state: HitlState) -> HitlState:
        got = await durable("join", _effect_now, "join")
        return {"summary": f"{got}|{len(state['results'])}"}

    g = StateGraph(HitlState)
    g.add_node("plan", plan)
    g.add_node("research", research)
    g.add_node("sub", sub)
    g.add_node("approve", approve)
    g.add_node("join", join)
    g.add_edge(START, "plan")
    for n in ("research", "sub", "approve"):
        g.add_edge("plan", n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    return g.compile(checkpointer=checkpointer)


_SAVERS: dict[str, Any] = {}


async def hitl_saver(dsn: str) -> Any:
    saver = _SAVERS.get(dsn)
    if saver is None:
        saver = _SAVERS[dsn] = DeterministicSaver(dsn)
        await saver.asetup()
    return saver


def hitl_input(req: dict[str, Any]) -> Any:
    if req.get("resume") is not None:
        return Command(resume=req["resume"])
    return {"topic": req["topic"], "results": []}


def hitl_output(out: dict[str, Any]) -> dict[str, Any]:
    return {
        "results": sorted(out.get("results", [])),
        "summary": out.get("summary"),
        "interrupts": [[i.id, i.value] for i in out.get("__interrupt__", [])],
    }


# -- durable timers and misuse of the handler's ctx ---------------------------------------


def sleepy_graph(width: int = 4) -> Any:
    """Each branch: an op, a durable timer, an op. Half the branches sleep through
    restate_context(), half through the handler's own ctx (passed in the config)."""

    def branch(i: int) -> Any:
        async def node(state: FanState, config: RunnableConfig) -> FanState:
            await jitter()
            a = await durable("before", effect, f"z{i}.before", state["req"])
            ctx = config["configurable"]["handler_ctx"] if i % 2 else restate_context()
            await ctx.sleep(timedelta(milliseconds=40 * (i + 1)))
            b = await durable("after", effect, f"z{i}.after", state["req"])
            return {"results": [a, b]}

        return node

    g = StateGraph(FanState)
    for i in range(width):
        g.add_node(f"z{i}", branch(i))
        g.add_edge(START, f"z{i}")
        g.add_edge(f"z{i}", END)
    return g.compile()


def rawctx_graph(width: int = 4) -> Any:
    """Parallel nodes calling run_typed on the handler's own ctx (not restate_context())."""

    def branch(i: int) -> Any:
        async def node(state: FanState, config: RunnableConfig) -> FanState:
            ctx = config["configurable"]["handler_ctx"]
            out = []
            for j in range(2):
                await jitter()
                out.append(await ctx.run_typed(f"op{j}", effect, restate.RunOptions(),
                                               f"r{i}.op{j}", state["req"]))
            return {"results": out}

        return node

    g = StateGraph(FanState)
    for i in range(width):
        g.add_node(f"r{i}", branch(i))
        g.add_edge(START, f"r{i}")
        g.add_edge(f"r{i}", END)
    return g.compile()


def select_graph() -> Any:
    """restate.select over routed ops, not caught: the run must fail terminally."""

    async def race(state: FanState) -> FanState:
        ctx = restate_context()
        await restate.select(a=ctx.run_typed("sa", _sleep_op, restate.RunOptions(), 0.0),
                             b=ctx.run_typed("sb", _sleep_op, restate.RunOptions(), 0.0))
        return {"results": ["select returned"]}

    async def other(state: FanState) -> FanState:
        return {"results": [await durable("other", effect, "sel.other", state["req"])]}

    g = StateGraph(FanState)
    for name, fn in (("race", race), ("other", other)):
        g.add_node(name, fn)
        g.add_edge(START, name)
        g.add_edge(name, END)
    return g.compile()


def racing_graph() -> Any:
    """Two coroutines of one node each call durable("fetch", ...) after other awaits: the
    numbering of the two ops would depend on timing. Must fail terminally."""

    async def node(state: FanState) -> FanState:
        async def one(url: str, delay: float) -> str:
            await asyncio.sleep(delay)
            return await durable("fetch", _slow_effect, f"race.{url}", state["req"])

        got = await asyncio.gather(one("a", 0.0), one("b", 0.01))
        return {"results": list(got)}

    g = StateGraph(FanState)
    g.add_node("fetch_both", node)
    g.add_edge(START, "fetch_both")
    g.add_edge("fetch_both", END)
    return g.compile()


async def _slow_effect(label: str, req: dict[str, Any]) -> str:
    await asyncio.sleep(0.2)  # still in flight when the sibling coroutine asks
    return await effect(label, req)


# -- benchmark shapes (see benchmarks/bench_restate_runner.py) -------------------------------


class BenchState(TypedDict, total=False):
    req: dict[str, Any]
    results: Annotated[list[str], operator.add]


def bench_graph(branches: int = 4, ops: int = 4) -> Any:
    def branch(i: int) -> Any:
        async def node(state: BenchState) -> BenchState:
            out = []
            for j in range(ops):
                delay = 0.4 if i == j else 0.05
                out.append(await durable(f"op{j}", _sleep_op, delay))
            return {"results": out}

        return node

    g = StateGraph(BenchState)
    for i in range(branches):
        g.add_node(f"b{i}", branch(i))
        g.add_edge(START, f"b{i}")
        g.add_edge(f"b{i}", END)
    return g.compile()


async def _sleep_op(delay: float) -> str:
    await asyncio.sleep(delay)
    return "ok"


# -- the service ---------------------------------------------------------------------------

GRAPHS = {
    "fanout": fanout_graph,
    "mapreduce": mapreduce_graph,
    "nested": nested_graph,
    "gather": gather_graph,
    "agent": agent_graph,
    "durable_agent": durable_agent_graph,
    "combinators": combinators_graph,
    "fanout_ctx": fanout_ctx_graph,
    "agents": agents_graph,
    "sleepy": sleepy_graph,
    "rawctx": rawctx_graph,
    "select": select_graph,
    "racing": racing_graph,
}
_BUILT: dict[str, Any] = {}

svc = restate.Service("Graphs")


async def _run_graph(ctx: restate.Context, shape: str, req: dict[str, Any]) -> dict[str, Any]:
    graph = _BUILT.get(shape)
    if graph is None:
        graph = _BUILT[shape] = GRAPHS[shape]()
    _REQ["current"] = req
    _ATTEMPT.set(f"{os.getpid()}-{uuid.uuid4().hex[:8]}")  # the tasks of this attempt inherit it
    runner = DeterministicRunner(journal=RestateJournal(ctx))
    # Some shapes reach for the handler's own ctx through the config (see rawctx_graph).
    config = {"configurable": {"handler_ctx": ctx}}
    out = await runner.ainvoke(graph, {"req": req, "results": []}, config)
    return {"results": sorted(out.get("results", [])), "summary": out.get("summary")}


def _register_shape(shape: str) -> None:
    """One handler per graph shape, named after it; all run the graph the same way."""

    async def handler(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
        return await _run_graph(ctx, shape, req)

    handler.__name__ = handler.__qualname__ = shape
    svc.handler(name=shape)(handler)


for _shape in ("fanout", "mapreduce", "nested", "gather", "combinators", "agent", "agents",
               "fanout_ctx", "sleepy", "rawctx", "select", "racing", "durable_agent"):  # fmt: skip
    _register_shape(_shape)


@svc.handler()
async def hitl(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """One turn on a thread kept by DeterministicSaver: {dsn, thread, run_id, turn,
    topic | resume, effects, gate, slow}."""
    _REQ["current"] = req
    graph = _BUILT.get("hitl:" + req["dsn"])
    if graph is None:
        graph = _BUILT["hitl:" + req["dsn"]] = hitl_graph(await hitl_saver(req["dsn"]))
    runner = DeterministicRunner(journal=RestateJournal(ctx))
    out = await runner.ainvoke(graph, hitl_input(req), run_config(req["thread"], req["run_id"]))
    return hitl_output(out)


@svc.handler()
async def naive(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """The same fan-out without DeterministicRunner: the baseline that breaks."""
    graph = _BUILT.get("fanout_ctx") or _BUILT.setdefault("fanout_ctx", fanout_ctx_graph())
    out = await graph.ainvoke({"req": req, "results": []})
    return {"results": sorted(out.get("results", [])), "summary": None}


@svc.handler()
async def bench(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    graph = _BUILT.get("bench")
    if graph is None:
        graph = _BUILT["bench"] = bench_graph()
    runner = DeterministicRunner(journal=RestateJournal(ctx))
    t0 = time.perf_counter()
    out = await runner.ainvoke(graph, {"req": req, "results": []})
    stats = runner.last_stats
    return {
        "results": len(out["results"]),
        "elapsed": time.perf_counter() - t0,
        "decisions": stats.decisions_created,
        "ops": stats.ops_created,
    }


@svc.handler()
async def bench_bare(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """Baseline: n sequential bare ctx.run_typed calls of a no-op."""
    t0 = time.perf_counter()
    for j in range(int(req["n"])):
        await ctx.run_typed(f"op{j}", _sleep_op, restate.RunOptions(), 0.0)
    return {"results": int(req["n"]), "elapsed": time.perf_counter() - t0}


@svc.handler()
async def bench_runner_seq(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """The same sequential no-op calls, routed through a DeterministicRunner node."""

    class S(TypedDict, total=False):
        n: int
        done: int

    async def node(state: S) -> S:
        for j in range(state["n"]):
            await durable(f"op{j}", _sleep_op, 0.0)
        return {"done": state["n"]}

    g = StateGraph(S)
    g.add_node("seq", node)
    g.add_edge(START, "seq")
    g.add_edge("seq", END)
    runner = DeterministicRunner(journal=RestateJournal(ctx))
    t0 = time.perf_counter()
    out = await runner.ainvoke(g.compile(), {"n": int(req["n"])})
    return {"results": out["done"], "elapsed": time.perf_counter() - t0}


if os.environ.get("LGD_DEBUG"):
    import logging

    logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("asyncio", "hpack", "httpcore", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

app = restate.app(services=[svc])
