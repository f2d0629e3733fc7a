"""A checkpoint streamed by ``stream_mode="debug"`` carries the config the history gives
for it, as with PostgresSaver: the keys the saver hands a graph run (its attempt token,
what it loaded) are LangGraph-internal ones the stream leaves out (LangGraph's own
test_debug_retry failed under run_id_policy="warn" while they showed)."""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_deterministic import DeterministicSaver, run_config


class Trail(TypedDict):
    steps: Annotated[list[str], operator.add]


def _graph(saver: DeterministicSaver) -> Any:
    builder = StateGraph(Trail)
    builder.add_node("first", lambda s: {"steps": ["first"]})
    builder.add_node("second", lambda s: {"steps": ["second"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    return builder.compile(checkpointer=saver)


def _conf(config: RunnableConfig | None) -> dict[str, Any] | None:
    """The configurable, without run_config's ``run_id``: a key of the caller's config,
    which a streamed config shows as with any saver."""
    if config is None:
        return None
    return {k: v for k, v in config["configurable"].items() if k != "run_id"}


@pytest.mark.parametrize("policy", ["warn", "require"])
@pytest.mark.parametrize("mode", ["debug", "checkpoints"])
def test_streamed_checkpoint_configs_are_the_historys(db: str, policy: str, mode: str) -> None:
    thread = f"debug-{uuid.uuid4().hex[:8]}"

    def config(run: str, **extra: Any) -> RunnableConfig:
        extra.pop("thread_id", None)
        if policy == "warn":
            return {"configurable": {"thread_id": thread, **extra}}
        return run_config(thread, run, **extra)

    with DeterministicSaver(db, run_id_policy=policy) as saver:  # type: ignore[arg-type]
        graph = _graph(saver)
        graph.invoke({"steps": []}, config("r1"), durability="async")
        # fork before step 1 and run the rest again from there, streamed
        before_first = next(
            c.parent_config for c in saver.list(config("r1")) if c.metadata["step"] == 1
        )
        assert before_first is not None
        fork = graph.update_state(config("r2", **before_first["configurable"]), values=None)
        events = graph.stream(
            None, config("r3", **fork["configurable"]), stream_mode=mode, durability="async"
        )
        streamed = [
            event["payload"] if mode == "debug" else event
            for event in events
            if mode != "debug" or event["type"] == "checkpoint"
        ]
        history = {
            c.config["configurable"]["checkpoint_id"]: c
            for c in graph.get_state_history(config("r4"))
        }
    assert len(streamed) >= 2, streamed
    for payload in streamed:
        seen = history[payload["config"]["configurable"]["checkpoint_id"]]
        assert _conf(payload["config"]) == _conf(seen.config)
        assert _conf(payload["parent_config"]) == _conf(seen.parent_config)
        assert all(not k.startswith("__") for k in payload["config"]["configurable"])
