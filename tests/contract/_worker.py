"""One graph call in its own OS process: ``python -m tests.contract._worker DSN THREAD RUN [TEXT]``.

Exit codes: 0 done, 3 ConcurrentRunError, 4 another DeterministicError, 5 ThreadBusyError,
6 RunUnfinishedError. Env ``LGD_PAUSE_AT`` / ``LGD_RELEASE`` make a node pause (see
graphs.py); ``LGD_GRAPH`` picks the graph (pipeline, chat, agent); ``LGD_STRATEGY`` and
``LGD_LEASE_TTL`` configure the saver; ``LGD_START`` names a file to wait for after
start-up, so that many workers call the graph at the same moment.

``RUN`` and ``TEXT`` may be comma-separated lists: the process then makes one graph call
per run, all at once (one thread each, one saver), prints ``<run> <exit code> <output or
error>`` per run and exits 0.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.contract.graphs import ask, build_agent, build_chat, build_pipeline

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    DeterministicError,
    RunUnfinishedError,
    ThreadBusyError,
)

GRAPHS = {"pipeline": build_pipeline, "chat": build_chat, "agent": build_agent}
CODES = {ConcurrentRunError: 3, ThreadBusyError: 5, RunUnfinishedError: 6}


def call(graph: Any, thread: str, run: str, text: str) -> tuple[int, str]:
    try:
        out = graph.invoke(ask(text), run_config(thread, run), durability="sync")
    except DeterministicError as exc:
        return CODES.get(type(exc), 4), f"{type(exc).__name__}: {exc}"
    return 0, str(out["messages"][-1].content)


def main() -> int:
    dsn, thread, run = sys.argv[1:4]
    text = sys.argv[4] if len(sys.argv) > 4 else "write the report"
    strategy = os.environ.get("LGD_STRATEGY", "reject")
    ttl = float(os.environ.get("LGD_LEASE_TTL", "30"))
    with DeterministicSaver(dsn, multitask_strategy=strategy, lease_ttl=ttl) as saver:  # type: ignore[arg-type]
        graph = GRAPHS[os.environ.get("LGD_GRAPH", "pipeline")](dsn).compile(checkpointer=saver)
        if start := os.environ.get("LGD_START"):
            while not Path(start).exists():
                time.sleep(0.01)
        if "," not in run:
            code, out = call(graph, thread, run, text)
            print(out, file=sys.stderr if code else sys.stdout)
            return code
        runs, texts = run.split(","), text.split(",")
        found: dict[str, tuple[int, str]] = {}

        def one(r: str, t: str) -> None:
            found[r] = call(graph, thread, r, t)

        workers = [threading.Thread(target=one, args=rt) for rt in zip(runs, texts, strict=True)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    for r in runs:
        code, out = found[r]
        print(f"{r} {code} {out}".replace("\n", " "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
