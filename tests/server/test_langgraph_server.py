"""DeterministicSaver under a real ``langgraph dev``, driven through langgraph-sdk: the
langgraph.json block of docs/how-to/langgraph-server.md, copied as is into a fresh
project, serves every run below (servers.py)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import time
import uuid
from typing import Any

import psycopg
import pytest
from langgraph_sdk import get_client  # a dependency of langgraph
from langgraph_sdk.errors import ConflictError
from tests.server.servers import PAGE, LangGraphDev, humans, unanswered


def client(server: LangGraphDev) -> Any:
    return get_client(url=server.url, timeout=60)


def contents(values: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in values.get("messages", [])]


def ledger(db: str, thread: str) -> dict[str, str]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT run_id, status FROM lgd_runs WHERE thread_id = %s ORDER BY created_at",
            (thread,),
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def lease(db: str, thread: str) -> tuple[str, str | None] | None:
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT run_id, ended FROM lgd_leases WHERE thread_id = %s", (thread,)
        ).fetchone()
    return None if row is None else (row[0], row[1])


async def wait_for(predicate: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s")


async def at_tool(c: Any, thread: str) -> bool:
    """The agent's tool call is stored and the tool is running."""
    state = await c.threads.get_state(thread)
    return state["next"] == ["tools"]


async def new_thread(c: Any) -> str:
    return str((await c.threads.create())["thread_id"])


async def test_a_run_takes_the_servers_run_id_and_ends_its_lease(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    run = await c.runs.create(thread, "agent", input={"messages": [("user", "hi")]})
    await c.runs.join(thread, run["run_id"])
    state = await c.threads.get_state(thread)
    assert contents(state["values"]) == ["hi", "echo: hi"]
    assert list(ledger(db, thread)) == [run["run_id"]]
    assert lease(db, thread) == (run["run_id"], "ok")


@pytest.mark.parametrize(
    "message",
    [{"role": "user", "content": "tool 0 a"}, {"type": "human", "content": "tool 0 a"},
     {"role": "user", "content": [{"type": "text", "text": "plain"}]}],
    ids=["role-dict", "type-dict", "content-blocks"],
)  # fmt: skip
async def test_streaming_a_tool_run(langgraph_server: LangGraphDev, message: Any) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    events = [
        e async for e in c.runs.stream(
            thread, "agent", input={"messages": [message]}, stream_mode=["updates", "values"]
        )
    ]  # fmt: skip
    kinds = {e.event for e in events}
    assert {"metadata", "updates", "values"} <= kinds
    final = [e.data for e in events if e.event == "values"][-1]
    assert unanswered(final) == []
    assert len(humans(final)) == 1


async def test_streaming_events(langgraph_server: LangGraphDev) -> None:
    """stream_mode "events": the server calls astream_events, another path to the graph."""
    c = client(langgraph_server)
    thread = await new_thread(c)
    events = [
        e async for e in c.runs.stream(
            thread, "agent", input={"messages": [("user", "tool 0 e")]}, stream_mode="events"
        )
    ]  # fmt: skip
    assert any(e.event == "events" and e.data.get("event") == "on_chain_start" for e in events)
    values = (await c.threads.get_state(thread))["values"]
    assert humans(values) == ["tool 0 e"] and unanswered(values) == []


async def test_a_resend_with_the_idempotency_key_applies_its_input_once(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    key = f"req-{uuid.uuid4()}"
    first = await c.runs.wait(
        thread, "agent", input={"messages": [("user", "tool 0 pay")]},
        metadata={"idempotency_key": key},
    )  # fmt: skip
    again = await c.runs.wait(
        thread, "agent", input={"messages": [("user", "tool 0 pay")]},
        metadata={"idempotency_key": key},
    )  # fmt: skip
    assert again == first
    assert humans(first) == ["tool 0 pay"] and unanswered(first) == []
    assert list(ledger(db, thread)) == [key]  # two server runs, one run of the contract
    with psycopg.connect(db) as conn:
        writers = conn.execute(
            "SELECT DISTINCT metadata->>'server_run_id' FROM checkpoints WHERE thread_id = %s",
            (thread,),
        ).fetchall()
    assert len(writers) == 1 and writers[0][0]  # the first request's server run wrote all
    # The same key with another input is refused before anything runs.
    run = await c.runs.create(
        thread, "agent", input={"messages": [("user", "other")]},
        metadata={"idempotency_key": key},
    )  # fmt: skip
    await c.runs.join(thread, run["run_id"])
    assert (await c.runs.get(thread, run["run_id"]))["status"] == "error"
    assert humans((await c.threads.get_state(thread))["values"]) == ["tool 0 pay"]
    # A run without a key still takes the next turn.
    out = await c.runs.wait(thread, "agent", input={"messages": [("user", "next")]})
    assert humans(out) == ["tool 0 pay", "next"]


async def test_interrupt_and_resume_through_the_api(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    await c.runs.wait(thread, "agent", input={"messages": [("user", "ask colour")]})
    state = await c.threads.get_state(thread)
    assert state["next"] == ["agent"] and state["interrupts"]
    assert (await c.threads.get(thread))["status"] == "interrupted"
    key = f"resume-{uuid.uuid4()}"
    out = await c.runs.wait(
        thread, "agent", command={"resume": "blue"}, metadata={"idempotency_key": key}
    )
    assert contents(out)[-1] == "answered: blue"
    # The same resume delivered again is refused (RunSupersededError): not answered twice.
    run = await c.runs.create(
        thread, "agent", command={"resume": "blue"}, metadata={"idempotency_key": key}
    )
    await c.runs.join(thread, run["run_id"])
    assert (await c.runs.get(thread, run["run_id"]))["status"] == "error"
    assert contents((await c.threads.get_state(thread))["values"]).count("answered: blue") == 1


async def test_state_updates_get_a_run_id_of_their_own(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    await c.runs.wait(thread, "agent", input={"messages": [("user", "hi")]})
    await c.threads.update_state(thread, {"messages": [("user", "noted")]}, as_node="agent")
    runs = ledger(db, thread)
    minted = [r for r in runs if r.startswith("update:")]
    assert len(minted) == 1, runs
    # A client's own run id for an update is kept (resending it is then recognised).
    await c.threads.update_state(
        thread, {"messages": [("user", "keyed")]}, as_node="agent",
        checkpoint={"run_id": "update-key-1"},
    )  # fmt: skip
    assert "update-key-1" in ledger(db, thread)
    out = await c.runs.wait(thread, "agent", input={"messages": [("user", "after")]})
    assert humans(out) == ["hi", "noted", "keyed", "after"]


async def test_time_travel_and_forks_through_the_api(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    await c.runs.wait(thread, "agent", input={"messages": [("user", "one")]})
    await c.runs.wait(thread, "agent", input={"messages": [("user", "two")]})
    history = await c.threads.get_history(thread, limit=20)
    after_one = next(s for s in history if contents(s["values"]) == ["one", "echo: one"])
    past = after_one["checkpoint"]["checkpoint_id"]
    # A new input at a past checkpoint: a branch, the later run's messages are not in it.
    out = await c.runs.wait(
        thread, "agent", input={"messages": [("user", "three")]}, checkpoint_id=past
    )
    assert humans(out) == ["one", "three"]
    # A state update at a past checkpoint: a fork of its own.
    forked = await c.threads.update_state(
        thread, {"messages": [("user", "fork")]}, as_node="tools", checkpoint_id=past
    )
    fork_state = await c.threads.get_state(thread, checkpoint_id=forked["checkpoint_id"])
    assert humans(fork_state["values"]) == ["one", "fork"]
    # Replaying from a checkpoint (no input) runs what was next there, once.
    again = await c.runs.wait(thread, "agent", input=None, checkpoint_id=forked["checkpoint_id"])
    assert contents(again) == ["one", "echo: one", "fork", "echo: fork"]
    # A copy of the thread carries the whole history.
    copy = await c.threads.copy(thread)
    assert len(await c.threads.get_history(copy["thread_id"], limit=50)) == len(
        await c.threads.get_history(thread, limit=50)
    )


async def test_multitask_reject_and_enqueue(langgraph_server: LangGraphDev) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    first = await c.runs.create(thread, "agent", input={"messages": [("user", "tool 1 a")]})
    await wait_for(lambda: at_tool(c, thread))
    with pytest.raises(ConflictError):
        await c.runs.create(
            thread, "agent", input={"messages": [("user", "b")]}, multitask_strategy="reject"
        )
    second = await c.runs.create(
        thread, "agent", input={"messages": [("user", "c")]}, multitask_strategy="enqueue"
    )
    await c.runs.join(thread, first["run_id"])
    await c.runs.join(thread, second["run_id"])
    values = (await c.threads.get_state(thread))["values"]
    assert humans(values) == ["tool 1 a", "c"] and unanswered(values) == []


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_multitask_interrupt_and_rollback(
    langgraph_server: LangGraphDev, db: str, strategy: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    await c.runs.wait(thread, "agent", input={"messages": [("user", "start")]})
    first = await c.runs.create(thread, "agent", input={"messages": [("user", "tool 2 a")]})
    await wait_for(lambda: at_tool(c, thread))
    second = await c.runs.create(
        thread, "agent", input={"messages": [("user", "b")]}, multitask_strategy=strategy
    )
    await c.runs.join(thread, second["run_id"])
    assert (await c.runs.get(thread, second["run_id"]))["status"] == "success"
    values = (await c.threads.get_state(thread))["values"]
    if strategy == "rollback":
        # The server deletes the cancelled run (adelete_for_runs): its input is gone.
        assert humans(values) == ["start", "b"] and unanswered(values) == []
        assert first["run_id"] not in ledger(db, thread)
    else:
        # The cancelled run's half-done step stays, as with the server's own checkpointer.
        assert humans(values) == ["start", "tool 2 a", "b"]
        assert ledger(db, thread)[first["run_id"]] == "superseded"


async def test_a_cancelled_run_leaves_the_thread_to_the_next_run(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    run = await c.runs.create(thread, "agent", input={"messages": [("user", "tool 2 a")]})
    await wait_for(lambda: at_tool(c, thread))
    await c.runs.cancel(thread, run["run_id"], wait=True)
    assert (await c.runs.get(thread, run["run_id"]))["status"] == "interrupted"
    assert lease(db, thread) == (run["run_id"], "ok")
    out = await c.runs.wait(thread, "agent", input={"messages": [("user", "next")]})
    assert humans(out) == ["tool 2 a", "next"]


PAGE_URL = "http://127.0.0.1:2024"


async def test_the_pages_python_blocks_run_as_shown(
    langgraph_server: LangGraphDev, db: str
) -> None:
    """docs/how-to/langgraph-server.md's Python blocks, in order, in one namespace, as
    written (only the server's address differs)."""
    text = PAGE.read_text()
    codes = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(codes) == 3 and text.count(PAGE_URL) == 1
    namespace: dict[str, Any] = {}
    for index, code in enumerate(codes):
        source = code.replace(PAGE_URL, langgraph_server.url)
        compiled = compile(source, f"langgraph-server.md[{index}]", "exec",
                           flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # fmt: skip
        result = eval(compiled, namespace)
        if inspect.iscoroutine(result):
            await result
    thread = namespace["thread"]["thread_id"]
    result = namespace["result"]  # the resend's, after the other two calls
    assert humans(result) == ["tool 1 refund order 42"] and unanswered(result) == []
    assert humans(namespace["replayed"]) == ["hello"]
    assert contents(namespace["replayed"])[-1] == "echo: hello"
    assert {"order-42:refund", "order-42:fork"} <= set(ledger(db, thread))


async def test_a_key_on_a_run_that_creates_its_thread_is_handed_on(
    langgraph_server: LangGraphDev,
) -> None:
    """The page's warning: the server copies such a run's metadata into the thread's."""
    c = client(langgraph_server)
    thread = str(uuid.uuid4())
    await c.runs.wait(
        thread, "agent", input={"messages": [("user", "first")]}, if_not_exists="create",
        metadata={"idempotency_key": "inherited"},
    )  # fmt: skip
    assert (await c.threads.get(thread))["metadata"]["idempotency_key"] == "inherited"
    run = await c.runs.create(thread, "agent", input={"messages": [("user", "second")]})
    await c.runs.join(thread, run["run_id"])
    assert (await c.runs.get(thread, run["run_id"]))["status"] == "error"
    assert humans((await c.threads.get_state(thread))["values"]) == ["first"]


async def test_a_run_that_raised_is_rolled_back_by_the_next_run(
    langgraph_server: LangGraphDev, db: str
) -> None:
    """The factory's multitask_strategy "rollback": a thread whose run raised (a run the
    client cannot resend under the server's run id) takes its next run, without the
    failed run's half-done tool call."""
    c = client(langgraph_server)
    thread = await new_thread(c)
    await c.runs.wait(thread, "agent", input={"messages": [("user", "hi")]})
    key = f"boom-{uuid.uuid4()}"
    request = {
        "input": {"messages": [("user", "tool 0 boom")]},
        "metadata": {"idempotency_key": key},
    }
    failed = await c.runs.create(thread, "agent", **request)
    await c.runs.join(thread, failed["run_id"])
    assert (await c.runs.get(thread, failed["run_id"]))["status"] == "error"
    assert len(unanswered((await c.threads.get_state(thread))["values"])) == 1
    out = await c.runs.wait(thread, "agent", input={"messages": [("user", "next")]})
    assert humans(out) == ["hi", "next"] and unanswered(out) == []
    assert ledger(db, thread)[key] == "rolled_back"
    # Its resend now is refused (RunSupersededError): its input never lands late.
    late = await c.runs.create(thread, "agent", **request)
    await c.runs.join(thread, late["run_id"])
    assert (await c.runs.get(thread, late["run_id"]))["status"] == "error"
    assert humans((await c.threads.get_state(thread))["values"]) == ["hi", "next"]


async def recover(c: Any, thread: str, key: str, message: str) -> dict[str, Any]:
    """The documented recovery after a restart: the thread under its id again, then the
    request resent with its idempotency key."""
    await c.threads.create(thread_id=thread, if_exists="do_nothing", graph_id="agent")
    out: dict[str, Any] = await c.runs.wait(
        thread, "agent", input={"messages": [("user", message)]},
        metadata={"idempotency_key": key},
    )  # fmt: skip
    return out


# Last in the module: it kills the module's server (and starts it again).
async def test_a_server_killed_mid_run_and_restarted(
    langgraph_server: LangGraphDev, db: str
) -> None:
    c = client(langgraph_server)
    thread = await new_thread(c)
    key = f"req-{uuid.uuid4()}"
    await c.runs.create(
        thread, "agent", input={"messages": [("user", "tool 2 refund")]},
        metadata={"idempotency_key": key},
    )  # fmt: skip
    await wait_for(lambda: at_tool(c, thread))
    langgraph_server.kill()
    assert ledger(db, thread) == {key: "running"} and lease(db, thread) == (key, None)
    langgraph_server.start()
    # langgraph dev keeps threads and runs in memory and writes them to .langgraph_api every
    # 10 s: after a SIGKILL it knows the thread only when a flush fell between the thread's
    # creation and the kill (on a busy machine one can). The checkpoints are in Postgres,
    # and the documented recovery below holds either way.
    try:
        await c.threads.get(thread)
        known = True
    except Exception as exc:
        assert "not found" in str(exc).lower(), exc
        known = False
    await c.threads.create(thread_id=thread, if_exists="do_nothing", graph_id="agent")
    stuck = await c.threads.get_state(thread)
    if not known:
        assert stuck["next"] == ["tools"] and len(unanswered(stuck["values"])) == 1
    # The resend takes the killed run over: its input once, its tool call answered.
    out = await recover(c, thread, key, "tool 2 refund")
    assert humans(out) == ["tool 2 refund"] and unanswered(out) == []
    # A second resend returns the same state; the thread takes its next run.
    assert await recover(c, thread, key, "tool 2 refund") == out
    after = await c.runs.wait(thread, "agent", input={"messages": [("user", "next")]})
    assert humans(after) == ["tool 2 refund", "next"] and unanswered(after) == []
