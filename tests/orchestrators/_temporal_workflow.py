"""The trials' workflow: one activity per turn of a chat (imports nothing heavy: Temporal
runs workflow code in a sandbox that re-imports its module)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy


@workflow.defn
class ChatWorkflow:
    @workflow.run
    async def run(self, thread_id: str, turns: list[str], first: int = 1,
                  activity: str = "chat_turn", heartbeat_s: float = 2.0,
                  initial_s: float = 0.2) -> list[str]:  # fmt: skip
        answers = []
        for n, text in enumerate(turns, start=first):
            answer = await workflow.execute_activity(
                activity,
                args=[thread_id, f"turn-{n}", text],
                start_to_close_timeout=timedelta(seconds=120),
                heartbeat_timeout=timedelta(seconds=heartbeat_s),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=initial_s),
                    maximum_interval=timedelta(seconds=2),
                    maximum_attempts=30,
                ),
            )
            answers.append(answer)
        return answers
