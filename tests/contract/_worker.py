"""One graph call in its own OS process: ``python _worker.py DSN THREAD RUN [TEXT]``.

Exit codes: 0 done, 3 ConcurrentRunError, 4 another DeterministicError. Env
``LGD_PAUSE_AT`` / ``LGD_RELEASE`` make a node pause (see graphs.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "src"), str(HERE.parents[1])]

from tests.contract.graphs import ask, build_pipeline  # noqa: E402

from langgraph_deterministic.checkpointer import DeterministicSaver  # noqa: E402
from langgraph_deterministic.config import run_config  # noqa: E402
from langgraph_deterministic.errors import ConcurrentRunError, DeterministicError  # noqa: E402


def main() -> int:
    dsn, thread, run = sys.argv[1:4]
    text = sys.argv[4] if len(sys.argv) > 4 else "write the report"
    with DeterministicSaver(dsn) as saver:
        graph = build_pipeline(dsn).compile(checkpointer=saver)
        try:
            out = graph.invoke(ask(text), run_config(thread, run), durability="sync")
        except ConcurrentRunError as exc:
            print(f"ConcurrentRunError: {exc}", file=sys.stderr)
            return 3
        except DeterministicError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 4
    print(out["messages"][-1].content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
