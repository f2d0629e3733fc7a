"""``DurableMiddleware``: a ``create_agent`` agent whose model and tool calls are durable ops.

``create_agent(model, tools, middleware=[DurableMiddleware()])`` run by a
``DeterministicRunner`` journals every model call and every tool call through the active
journal (``PostgresJournal`` or ``RestateJournal``) via :func:`durable`: a retry returns
the journaled model responses and tool results instead of calling the model or the tool
again. Parallel tool calls are separate ops, named by their tool-call id (which is stable:
it comes from the journaled model response). Outside a runner the middleware does nothing.

Journaled values are plain dicts of LangChain's message dicts, so any journal's serde can
hold them (Restate's JSON one too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware.types import (
    AgentMiddleware,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages import messages_from_dict as _from_dicts
from langchain_core.messages import messages_to_dict as _to_dicts

from ._context import durable, durable_sync


def _active() -> bool:
    from ._context import _KEYED, _SCHEDULER

    return _KEYED.get() is not None or _SCHEDULER.get() is not None


def _dump_model(response: Any) -> dict[str, Any]:
    if isinstance(response, AIMessage):
        return {"kind": "message", "messages": _to_dicts([response])}
    if isinstance(response, ExtendedModelResponse):
        if response.command is not None:
            return {"kind": "extended", "raw": response}  # a Command: the journal's serde
        response = response.model_response
    if isinstance(response, ModelResponse):
        return {
            "kind": "response",
            "messages": _to_dicts(list(response.result)),
            "structured": response.structured_response,
        }
    return {"kind": "raw", "raw": response}


def _load_model(data: dict[str, Any]) -> Any:
    kind = data.get("kind")
    if kind == "message":
        return _from_dicts(data["messages"])[0]
    if kind == "response":
        messages: list[BaseMessage] = _from_dicts(data["messages"])
        return ModelResponse(result=messages, structured_response=data.get("structured"))
    return data.get("raw")


def _dump_tool(result: Any) -> dict[str, Any]:
    if isinstance(result, ToolMessage):
        return {"kind": "message", "messages": _to_dicts([result])}
    return {"kind": "raw", "raw": result}  # a Command: the journal's serde


def _load_tool(data: dict[str, Any]) -> Any:
    if data.get("kind") == "message":
        return _from_dicts(data["messages"])[0]
    return data.get("raw")


def _tool_op(request: Any) -> str:
    call = request.tool_call
    return f"tool:{call.get('name')}:{call.get('id')}"


class DurableMiddleware(AgentMiddleware[Any, Any]):
    """Journal the agent's model calls (op ``model``) and tool calls (op
    ``tool:<name>:<tool call id>``) through the active DeterministicRunner journal."""

    def __init__(self, *, model: bool = True, tools: bool = True) -> None:
        super().__init__()
        self._model = model
        self._tools = tools

    # model calls -------------------------------------------------------------------

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Any]
    ) -> Any:
        if not (self._model and _active()):
            return handler(request)
        data = durable_sync("model", lambda: _dump_model(handler(request)))
        return _load_model(data)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[Any]],
    ) -> Any:
        if not (self._model and _active()):
            return await handler(request)

        async def call() -> dict[str, Any]:
            return _dump_model(await handler(request))

        return _load_model(await durable("model", call))

    # tool calls --------------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if not (self._tools and _active()):
            return handler(request)
        return _load_tool(durable_sync(_tool_op(request), lambda: _dump_tool(handler(request))))

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        if not (self._tools and _active()):
            return await handler(request)

        async def call() -> dict[str, Any]:
            return _dump_tool(await handler(request))

        return _load_tool(await durable(_tool_op(request), call))


__all__ = ["DurableMiddleware"]
