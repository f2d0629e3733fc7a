"""One turn of the trials' agent as a job process (a Kubernetes Job's pod, a cron run):
``python -m tests.orchestrators._job THREAD RUN_ID TEXT MODE``. ``MODE`` ``invoke``:
``retry.invoke_with_retries`` (finishes a dead run first); ``call``:
``call_with_retries(lambda: graph.invoke(...))``, the loop the retry-loops page showed
before it. Env as tests/orchestrators/_celery_app.py. Exits with ``retry.exit_code``."""

from __future__ import annotations

import os
import sys

from tests.orchestrators import _agent

from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.retry import call_with_retries, exit_code


def main(thread: str, run_id: str, text: str, mode: str) -> int:
    ttl = float(os.environ.get("LGD_TRIAL_LEASE_TTL", "2"))
    journal = os.environ.get("LGD_TRIAL_JOURNAL") == "1"
    with DeterministicSaver(os.environ["LGD_TRIAL_DSN"], lease_ttl=ttl) as saver:
        graph = _agent.build(saver)
        try:
            if mode == "invoke":
                from langgraph_deterministic.retry import invoke_with_retries

                invoke_with_retries(graph, _agent.ask(text), thread_id=thread, run_id=run_id,
                                    journal=journal)  # fmt: skip
            else:
                call_with_retries(lambda: graph.invoke(_agent.ask(text), run_config(thread, run_id),
                                                       durability="sync"))  # fmt: skip
        except Exception as exc:
            _agent.outcome(thread, run_id, exc)
            return exit_code(exc)
    _agent.outcome(thread, run_id, None)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
