"""A Restate service whose LangGraph graph fans out to parallel nodes making durable calls.

Run it (restate-server running locally, see docs/explanation/deterministic-replay-on-restate.md):

    pip install 'langgraph-deterministic[restate]' hypercorn
    python examples/restate_parallel_research.py     # serves on 127.0.0.1:9080
    restate deployments register http://127.0.0.1:9080
    curl localhost:8080/Research/run --json '{"topics": ["tides", "moons", "orbits"]}'

It binds to loopback unless ``RESEARCH_HOST`` says otherwise (``0.0.0.0`` in a container,
so that restate-server in another container can reach it: see docker-compose.yml);
``RESEARCH_PORT`` sets the port. ``docker compose up --build`` runs all of it.
"""

from __future__ import annotations

import asyncio
import operator
import os
from typing import Annotated, Any

import restate
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from langgraph_deterministic.runner import DeterministicRunner, RestateJournal, durable


class State(TypedDict, total=False):
    topics: list[str]
    notes: Annotated[list[str], operator.add]
    report: str


class Topic(TypedDict):
    topic: str


async def search(topic: str) -> str:  # stands in for a real API or LLM call
    await asyncio.sleep(0.1)
    return f"facts about {topic}"


async def summarise(text: str) -> str:
    await asyncio.sleep(0.05)
    return text.upper()


async def tag(text: str) -> str:
    await asyncio.sleep(0.05)
    return f"#{len(text)}"


def fan_out(state: State) -> list[Send]:
    return [Send("research", {"topic": t}) for t in state["topics"]]


async def research(state: Topic) -> State:
    found = await durable("search", search, state["topic"])
    summary, label = await asyncio.gather(  # two durable ops in flight in one node
        durable("summarise", summarise, found),
        durable("tag", tag, found),
    )
    return {"notes": [f"{summary} {label}"]}


async def write_report(state: State) -> State:
    report = await durable("write", lambda notes: "\n".join(sorted(notes)), state["notes"])
    return {"report": report}


builder = StateGraph(State)
builder.add_node("research", research)
builder.add_node("write", write_report)
builder.add_conditional_edges(START, fan_out, ["research"])
builder.add_edge("research", "write")
builder.add_edge("write", END)
graph = builder.compile()

svc = restate.Service("Research")


@svc.handler()
async def run(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    runner = DeterministicRunner(journal=RestateJournal(ctx))
    out = await runner.ainvoke(graph, {"topics": req["topics"], "notes": []})
    return {"report": out["report"]}


app = restate.app(services=[svc])

HOST_ENV, PORT_ENV = "RESEARCH_HOST", "RESEARCH_PORT"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 9080


def bind_address() -> str:
    """Where to serve: loopback by default; $RESEARCH_HOST / $RESEARCH_PORT override."""
    host = os.environ.get(HOST_ENV, DEFAULT_HOST)
    port = int(os.environ.get(PORT_ENV, DEFAULT_PORT))
    return f"{host}:{port}"


def main() -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [bind_address()]
    print(f"serving the Research service on http://{config.bind[0]}", flush=True)
    asyncio.run(serve(app, config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
