"""A Temporal worker process for the trials: ``python -m tests.orchestrators._temporal_worker
ADDRESS TASK_QUEUE``. Env: ``LGD_TRIAL_DSN`` (the database), ``LGD_TRIAL_JOURNAL=1`` (journal
the refund), ``LGD_TRIAL_LEASE_TTL`` (the saver's lease_ttl, default 2 s)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from tests.orchestrators import _agent
from tests.orchestrators._temporal_workflow import ChatWorkflow

from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.temporal import activity_run_id, run_graph, run_graph_sync

SAVER = DeterministicSaver(
    os.environ["LGD_TRIAL_DSN"], lease_ttl=float(os.environ.get("LGD_TRIAL_LEASE_TTL", "2"))
)
GRAPH = _agent.build(SAVER)
JOURNAL = os.environ.get("LGD_TRIAL_JOURNAL") == "1"


def _record(thread_id: str, step: str, exc: BaseException | None) -> None:
    cause = exc.__cause__ if isinstance(exc, ApplicationError) and exc.__cause__ else exc
    _agent.outcome(thread_id, activity_run_id(step), cause)


def _answer(out: Any) -> str:
    return str(out["messages"][-1].content)


@activity.defn
async def chat_turn(thread_id: str, step: str, text: str) -> str:
    try:
        out = await run_graph(GRAPH, _agent.ask(text), thread_id=thread_id, step=step,
                              journal=JOURNAL)  # fmt: skip
    except BaseException as exc:
        await asyncio.shield(asyncio.to_thread(_record, thread_id, step, exc))
        raise
    await asyncio.to_thread(_record, thread_id, step, None)
    return _answer(out)


@activity.defn
def chat_turn_sync(thread_id: str, step: str, text: str) -> str:
    try:
        out = run_graph_sync(GRAPH, _agent.ask(text), thread_id=thread_id, step=step,
                             journal=JOURNAL)  # fmt: skip
    except BaseException as exc:
        _record(thread_id, step, exc)
        raise
    _record(thread_id, step, None)
    return _answer(out)


async def main(address: str, queue: str) -> None:
    client = await Client.connect(address)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        worker = Worker(client, task_queue=queue, workflows=[ChatWorkflow],
                        activities=[chat_turn, chat_turn_sync], activity_executor=pool,
                        # no sticky workflow cache: a killed worker's workflows move on at
                        # once instead of after the sticky queue's timeout
                        max_cached_workflows=0)  # fmt: skip
        print("worker ready", flush=True)
        await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
