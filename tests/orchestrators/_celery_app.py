"""The trials' Celery app: ``celery -A tests.orchestrators._celery_app worker --pool prefork``.

Env: ``LGD_TRIAL_BROKER`` (a redis URL), ``LGD_TRIAL_DSN``, ``LGD_TRIAL_JOURNAL=1``,
``LGD_TRIAL_VISIBILITY`` (the broker's visibility timeout, default 4 s),
``LGD_TRIAL_LEASE_TTL`` (default 2 s), ``LGD_TRIAL_RESTORE_INTERVAL`` /
``LGD_TRIAL_RESTORE_THROTTLE`` (kombu's restore sweep, default 1 / 1),
``LGD_TRIAL_MUTEX_EXPIRE`` (kombu's ``unacked_mutex_expire``, default 300). The settings are the ones docs/how-to/celery.md
recommends.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.exceptions import Retry
from tests.orchestrators import _agent

from langgraph_deterministic.celery import WorkerLocal, run_graph_task, worker_saver

app = Celery("lgd_trials", broker=os.environ["LGD_TRIAL_BROKER"])
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("LGD_TRIAL_VISIBILITY", "4")),
        # sweep for messages past their visibility timeout every second (kombu's
        # default: every 100 s, interval 10 x throttle 10)
        "unacked_restore_interval": int(os.environ.get("LGD_TRIAL_RESTORE_INTERVAL", "1")),
        "unacked_restore_throttle": int(os.environ.get("LGD_TRIAL_RESTORE_THROTTLE", "1")),
        "unacked_mutex_expire": int(os.environ.get("LGD_TRIAL_MUTEX_EXPIRE", "300")),
    },
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

SAVER = worker_saver(
    os.environ["LGD_TRIAL_DSN"], lease_ttl=float(os.environ.get("LGD_TRIAL_LEASE_TTL", "2"))
)
GRAPH = WorkerLocal(lambda: _agent.build(SAVER.get()))
JOURNAL = os.environ.get("LGD_TRIAL_JOURNAL") == "1"


@app.task(bind=True, max_retries=30, autoretry_for=(OSError,), retry_backoff=0.2,
          retry_backoff_max=2, retry_jitter=False)  # fmt: skip
def chat_turn(self: Any, thread_id: str, text: str, turn_key: str | None = None) -> str:
    run_id = turn_key or self.request.id
    try:
        out = run_graph_task(self, GRAPH.get(), _agent.ask(text), thread_id=thread_id,
                             run_id=turn_key, journal=JOURNAL)  # fmt: skip
    except BaseException as exc:
        cause = exc.exc if isinstance(exc, Retry) and exc.exc is not None else exc
        _agent.outcome(thread_id, run_id, cause)
        raise
    _agent.outcome(thread_id, run_id, None)
    return str(out["messages"][-1].content)
