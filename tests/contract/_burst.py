"""Bursts of runs on one thread across OS processes, each process's runs through one
shared pool: the worker (``python -m tests.contract._burst DSN THREAD MODE POOL RUNS``)
and the checks the tests and ``scripts/contract_trials.py`` make of a burst.

A worker builds one ``DeterministicSaver(dsn, pool_max_size=POOL)`` and starts every run
of its comma-separated ``RUNS`` at once, with its graph call of ``MODE`` (``sync``: one
thread each; ``async``: one task each on one event loop), after waiting for the file
``$LGD_START``. It prints ``<run> <exit code> <output or error>`` per run. Exit codes as
``_worker``: 0 done, 3 ConcurrentRunError, 4 another DeterministicError, 5
ThreadBusyError, 6 RunUnfinishedError, 7 anything else (a raw psycopg error, a pool
timeout: never expected).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg

from langgraph_deterministic.checkpointer import DeterministicSaver
from langgraph_deterministic.config import run_config
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    DeterministicError,
    RunUnfinishedError,
    ThreadBusyError,
)

CODES = {ConcurrentRunError: 3, ThreadBusyError: 5, RunUnfinishedError: 6}


def _code(exc: BaseException) -> tuple[int, str]:
    code = CODES.get(type(exc), 4) if isinstance(exc, DeterministicError) else 7
    return code, f"{type(exc).__name__}: {exc}"


def _main() -> int:
    from tests.contract.graphs import ask, build_chat

    dsn, thread, mode, pool, runs_arg = sys.argv[1:6]
    runs = runs_arg.split(",")
    strategy = os.environ.get("LGD_STRATEGY", "reject")
    found: dict[str, tuple[int, str]] = {}

    started: list[float] = []
    finished: list[float] = []

    def wait_start() -> None:
        if start := os.environ.get("LGD_START"):
            Path(f"{start}.ready.{os.getpid()}").touch()
            while not Path(start).exists():
                time.sleep(0.005)
        started.append(time.monotonic())

    def text_of(run: str) -> str:
        return f"msg-{run}"

    if mode == "sync":
        with DeterministicSaver(
            dsn,
            multitask_strategy=strategy,
            pool_max_size=int(pool),  # type: ignore[arg-type]
        ) as saver:
            graph = build_chat(dsn).compile(checkpointer=saver)
            graph.get_state({"configurable": {"thread_id": "warm"}})  # the pool is open

            def one(run: str) -> None:
                try:
                    out = graph.invoke(
                        ask(text_of(run)), run_config(thread, run), durability="sync"
                    )
                    found[run] = (0, str(out["messages"][-1].content))
                except Exception as exc:
                    found[run] = _code(exc)

            wait_start()
            workers = [threading.Thread(target=one, args=(r,)) for r in runs]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            finished.append(time.monotonic())
    else:

        async def main() -> None:
            async with DeterministicSaver(
                dsn,
                multitask_strategy=strategy,
                pool_max_size=int(pool),  # type: ignore[arg-type]
            ) as saver:
                graph = build_chat(dsn).compile(checkpointer=saver)
                await graph.aget_state({"configurable": {"thread_id": "warm"}})

                async def one(run: str) -> None:
                    try:
                        out = await graph.ainvoke(
                            ask(text_of(run)), run_config(thread, run), durability="sync"
                        )
                        found[run] = (0, str(out["messages"][-1].content))
                    except Exception as exc:
                        found[run] = _code(exc)

                await asyncio.to_thread(wait_start)
                await asyncio.gather(*(one(r) for r in runs))
                finished.append(time.monotonic())

        asyncio.run(main())
    elapsed = finished[0] - started[0]
    for run in runs:
        code, out = found[run]
        print(f"{run} {code} {out}".replace("\n", " "), flush=True)
    print(f"#elapsed {elapsed:.3f}", flush=True)
    return 0


# -- the driver side ----------------------------------------------------------------------


def burst(
    db: str,
    thread: str,
    strategy: str,
    n: int,
    pool: int,
    modes: tuple[str, ...],
    tmp: Path,
    processes: int = 2,
    sleep: float = 0.02,
) -> tuple[dict[str, tuple[int, str]], float]:
    """``n`` runs started at once on ``thread`` in ``processes`` processes (their modes
    taken in turn from ``modes``); returns each run's (code, output or error) and the wall
    time from the start signal to the last run's end (measured in the workers, without
    their start-up and exit)."""
    start = tmp / f"start-{thread}"
    procs = []
    env = {**os.environ, "LGD_STRATEGY": strategy, "LGD_START": str(start),
           "LGD_SLEEP": str(sleep)}  # fmt: skip
    env.pop("LGD_PAUSE_AT", None)
    for p in range(processes):
        runs = ",".join(f"r{i:02d}" for i in range(p, n, processes))
        mode = modes[p % len(modes)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.contract._burst", db, thread, mode, str(pool), runs],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    # Every process up and its pool open (each reads a warm-up thread first): the workers
    # poll for the start file every 5 ms.
    time.sleep(float(os.environ.get("LGD_BURST_SETTLE", "3")))
    start.touch()
    found: dict[str, tuple[int, str]] = {}
    wall = 0.0
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        for line in out.splitlines():
            if line.startswith("#elapsed "):
                wall = max(wall, float(line.split()[1]))
                continue
            run, code, text = line.split(" ", 2)
            found[run] = (int(code), text)
    assert len(found) == n, found
    print(f"burst {strategy} n={n} pool={pool} modes={modes}: {wall:.2f} s", file=sys.stderr)
    return found, wall


def humans(db: str, thread: str) -> list[str]:
    from tests.contract.graphs import build_chat

    with DeterministicSaver(db) as saver:
        state = (
            build_chat(db)
            .compile(checkpointer=saver)
            .get_state({"configurable": {"thread_id": thread}})
        )
    return [m.content for m in state.values.get("messages", []) if m.type == "human"]


def check(db: str, thread: str, strategy: str, found: dict[str, tuple[int, str]]) -> Counter[int]:
    """What each strategy promises of a burst; then the thread takes a new run at once."""
    from tests.contract.graphs import ask, build_chat
    from tests.contract.test_processes import assert_linear

    codes = Counter(code for code, _ in found.values())
    unexpected = {r: v for r, v in found.items() if v[0] in (4, 6, 7)}
    assert not unexpected, unexpected
    kept = humans(db, thread)
    assert len(kept) == len(set(kept)), kept  # no input applied twice
    done = {f"msg-{r}" for r, (code, _) in found.items() if code == 0}
    assert all(out == f"re: msg-{r}" for r, (code, out) in found.items() if code == 0)
    if strategy == "enqueue":
        assert codes == {0: len(found)}, found
        assert sorted(kept) == sorted(done)
    elif strategy == "reject":
        assert set(codes) <= {0, 5} and codes[0] >= 1, codes
        assert set(kept) == done  # a refused run wrote nothing
    else:
        assert set(codes) <= {0, 3} and codes[0] >= 1, codes
        assert done <= set(kept)
    with psycopg.connect(db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM lgd_queue WHERE thread_id = %s", (thread,)
        ).fetchone() == (0,)
    assert_linear(db, thread)
    with DeterministicSaver(db) as saver:  # the thread takes a new run, at once
        out = (
            build_chat(db)
            .compile(checkpointer=saver)
            .invoke(ask("after"), run_config(thread, "after"), durability="sync")
        )
    assert out["messages"][-1].content == "re: after"
    assert_linear(db, thread)
    return codes


if __name__ == "__main__":
    sys.exit(_main())
