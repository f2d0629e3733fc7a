"""A ``create_agent`` agent with DurableMiddleware in its own OS process:
``python -m tests.runner._agent_worker DSN THREAD RUN``.

The chat model is a local fake (no network): with no tool result in the conversation it
asks for three tools at once (parallel tool calls), afterwards it answers. Every model
call and tool run logs to ``journal_effects``; env ``LGD_PAUSE_OP=slow`` stalls the tool
``slow`` until the file ``LGD_RELEASE`` exists. Prints the answer, then the journal stats
as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from tests.runner._journal_worker import Effects

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.runner import (
    DeterministicRunner,
    DurableMiddleware,
    PostgresJournal,
)


def build(effects: Effects) -> tuple[Any, list[Any]]:
    class ToolCallingFake(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "tool-calling-fake"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:  # fmt: skip
            effects.log("model")
            if not any(isinstance(m, ToolMessage) for m in messages):
                calls = [{"name": n, "args": {"q": n}, "id": f"call-{n}", "type": "tool_call"}
                         for n in ("fast_a", "fast_b", "slow")]  # fmt: skip
                msg = AIMessage(content="", tool_calls=calls)
            else:
                results = sorted(str(m.content) for m in messages if isinstance(m, ToolMessage))
                msg = AIMessage(content="answer from " + ", ".join(results))
            return ChatResult(generations=[ChatGeneration(message=msg)])

    pause = os.environ.get("LGD_PAUSE_OP")
    release = Path(os.environ.get("LGD_RELEASE", "/nonexistent"))

    def run_tool(name: str) -> str:
        effects.log(f"start:{name}")
        while name == pause and not release.exists():
            time.sleep(0.02)
        effects.log(f"done:{name}")
        return f"result of {name}"

    @tool
    async def fast_a(q: str) -> str:
        """Look something up."""
        return await asyncio.to_thread(run_tool, "fast_a")

    @tool
    async def fast_b(q: str) -> str:
        """Look something else up."""
        return await asyncio.to_thread(run_tool, "fast_b")

    @tool
    async def slow(q: str) -> str:
        """A three-minute tool call."""
        return await asyncio.to_thread(run_tool, "slow")

    return ToolCallingFake(), [fast_a, fast_b, slow]


async def main() -> int:
    dsn, thread, run = sys.argv[1:4]
    effects = Effects(dsn, thread)
    model, tools = build(effects)
    async with DeterministicSaver(dsn) as saver:
        agent = create_agent(model, tools, middleware=[DurableMiddleware()], checkpointer=saver)
        runner = DeterministicRunner(journal=PostgresJournal(saver))
        out = await runner.ainvoke(
            agent, {"messages": [HumanMessage("go")]}, run_config(thread, run), durability="sync"
        )
        stats = runner.last_stats
    print(out["messages"][-1].content)
    print(json.dumps({"executed": stats.executed, "replayed": stats.replayed}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
