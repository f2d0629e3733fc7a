"""LangGraph's server SIGKILLed mid-run, N times per saver: DeterministicSaver through
``langgraph_deterministic.server.checkpointer`` beside langgraph's AsyncPostgresSaver
through a factory of the same shape, with the same recovery.

Each trial: a fresh thread, a run whose agent calls a tool that takes 2 s, the server
SIGKILLed (its whole process group) while the tool runs, the server started again, then
the documented recovery (docs/how-to/langgraph-server.md): the thread created again
under its id and the request resent with its idempotency key; then one more run on the
thread (``--recovery new-run``: no resend, only that run). Counted per saver: inputs
applied more than once (and exactly once), tool calls left without an answer, threads
that took their next run.

    python scripts/server_kill_trials.py --trials 10     # needs the `server` extra
    LGD_SERVER_PYTHON=/path/to/server-venv/bin/python python scripts/...

Postgres: --dsn or $DATABASE_URL (an admin DSN: each saver gets a fresh database, dropped
at the end), else an embedded one. Not part of the test suite (about 25 s a trial).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langgraph_sdk import get_client
from tests.server.servers import LangGraphDev, check_available, humans, make_project, unanswered

from devtools.postgres import create_database, database_name, drop_database, ensure_database_url

PEER_FACTORY = """\
import contextlib
import os

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver


@contextlib.asynccontextmanager
async def checkpointer():
    async with AsyncPostgresSaver.from_conn_string(os.environ["POSTGRES_URI"]) as saver:
        await saver.setup()
        yield saver
"""


def project(root: Path, saver: str) -> Path:
    directory = make_project(root / saver)
    if saver == "peer":
        (directory / "peer_checkpointer.py").write_text(PEER_FACTORY)
        config = json.loads((directory / "langgraph.json").read_text())
        config["checkpointer"] = {"path": "./peer_checkpointer.py:checkpointer"}
        (directory / "langgraph.json").write_text(json.dumps(config, indent=2))
    return directory


async def at_tool(c: Any, thread: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await c.threads.get_state(thread))["next"] == ["tools"]:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"thread {thread} never reached its tool")


async def trial(server: LangGraphDev, n: int, recovery: str) -> dict[str, Any]:
    c = get_client(url=server.url, timeout=120)
    thread = str((await c.threads.create(graph_id="agent"))["thread_id"])
    key, message = f"trial-{n}-{uuid.uuid4().hex[:8]}", f"tool 2 refund-{n}"
    request = {"input": {"messages": [("user", message)]}, "metadata": {"idempotency_key": key}}
    await c.runs.create(thread, "agent", **request)
    await at_tool(c, thread)
    server.kill()
    started = time.monotonic()
    server.start()
    restart = time.monotonic() - started
    # The thread under its id again (langgraph dev forgot it), then the resend, or
    # (recovery "new-run") no resend: the next run comes first.
    await c.threads.create(thread_id=thread, if_exists="do_nothing", graph_id="agent")
    error = None
    if recovery == "resend":
        resent = await c.runs.wait(thread, "agent", **request)
        error = resent.get("__error__") if isinstance(resent, dict) else None
    after = await c.runs.wait(thread, "agent", input={"messages": [("user", f"next-{n}")]})
    values = (await c.threads.get_state(thread))["values"]
    took_next = (
        isinstance(after, dict) and "__error__" not in after and f"next-{n}" in humans(values)
    )
    return {
        "inputs_applied": humans(values).count(message),
        "duplicated_inputs": max(0, humans(values).count(message) - 1),
        "unanswered_tool_calls": len(unanswered(values)),
        "took_next_run": took_next,
        "resend_error": error,
        "restart_s": round(restart, 1),
    }


async def run_saver(
    saver: str, admin_dsn: str, root: Path, trials: int, recovery: str
) -> list[dict[str, Any]]:
    dsn = create_database(admin_dsn, prefix=f"lgd_trials_{saver}")
    server = LangGraphDev(project(root, saver), dsn)
    results = []
    try:
        server.start()
        for n in range(trials):
            results.append(await trial(server, n, recovery))
            print(saver, recovery, n, results[-1], flush=True)
    finally:
        server.stop()
        drop_database(admin_dsn, database_name(dsn))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--savers", default="deterministic,peer")
    parser.add_argument(
        "--recovery", default="resend", choices=["resend", "new-run"],
        help="after the restart: resend the request under its key (the documented "
        "recovery), or send only the next run",
    )  # fmt: skip
    args = parser.parse_args()
    check_available()
    url, embedded = (args.dsn, None) if args.dsn else ensure_database_url()
    try:
        with tempfile.TemporaryDirectory(prefix="lgd-server-trials-") as tmp:
            summary = {}
            for saver in args.savers.split(","):
                rows = asyncio.run(run_saver(saver, url, Path(tmp), args.trials, args.recovery))
                summary[saver] = {
                    "recovery": args.recovery,
                    "trials": len(rows),
                    "killed_inputs_applied_once": sum(r["inputs_applied"] == 1 for r in rows),
                    "duplicated_inputs": sum(r["duplicated_inputs"] for r in rows),
                    "unanswered_tool_calls": sum(r["unanswered_tool_calls"] for r in rows),
                    "threads_that_took_their_next_run": sum(r["took_next_run"] for r in rows),
                    "resends_that_failed": sum(1 for r in rows if r["resend_error"]),
                }
            print(json.dumps(summary, indent=2))
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
