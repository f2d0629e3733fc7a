"""The retry contract under bursts, races and late retries: the full matrix the default
suite samples (tests/contract/test_bursts.py, tests/contract/test_races.py).

    python scripts/contract_trials.py [--quick] [--only bursts,cancel,kill,twins]

* bursts: 20 and 50 runs started at once on one thread, under each multitask strategy,
  in 2 processes whose runs share one pool of 5 or of 10 connections each, sync and
  async: every enqueue run finishes, each input once, linear history; reject, interrupt
  and rollback as documented; the thread takes a new run afterwards. Prints each burst's
  wall time (a benchmark line, no threshold).
* cancel: a finished run retried (same run id and input) and cancelled every 0.5 ms from
  0 ms to past the run's length: the next run is admitted at once every time.
* kill: the same late retry in a process SIGKILLed 0..N ms after it calls the graph.
* twins: 50 pairs of attempts of one run started at once, in threads and in two
  processes, with and without the PostgresJournal: one finishes, the run's record says
  finished, the next run succeeds.

Uses $DATABASE_URL, or starts an embedded Postgres. Exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.postgres import create_database, ensure_database_url
from langgraph_deterministic import DeterministicSaver, run_config


def bursts(db: str, tmp: Path, quick: bool) -> None:
    from tests.contract._burst import burst, check

    sizes = (20,) if quick else (20, 50)
    pools = (5,) if quick else (5, 10)
    for n in sizes:
        for pool in pools:
            for modes in (("sync",), ("async",)):
                for strategy in ("enqueue", "reject", "interrupt", "rollback"):
                    thread = f"b-{n}-{pool}-{modes[0]}-{strategy}"
                    found, wall = burst(db, thread, strategy, n, pool, modes, tmp)
                    codes = check(db, thread, strategy, found)
                    print(
                        f"burst n={n} pool={pool} {modes[0]:5} {strategy:9} "
                        f"wall {wall:6.2f} s  outcomes {dict(sorted(codes.items()))}",
                        flush=True,
                    )


async def _cancel_sweep(db: str, quick: bool) -> None:
    from tests.contract.test_races import _lease, build

    async with DeterministicSaver(db) as saver:
        graph = build().compile(checkpointer=saver)
        thread = "cancel-sweep"
        await graph.ainvoke({"steps": ["warm"]}, run_config("cancel-warm", "w"))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await graph.ainvoke({"steps": ["in0"]}, run_config(thread, "r0"))
        length = loop.time() - t0
        step = 0.002 if quick else 0.0005
        delays = [i * step for i in range(int(length * 1.5 / step) + 2)]
        previous, slowest = "r0", 0.0
        for i, delay in enumerate(delays, start=1):
            retry = asyncio.ensure_future(
                graph.ainvoke({"steps": [f"in{i - 1}"]}, run_config(thread, previous))
            )
            await asyncio.sleep(delay)
            retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retry
            assert _lease(db, thread) == (previous, "ok"), (delay, _lease(db, thread))
            t1 = loop.time()
            out = await graph.ainvoke({"steps": [f"in{i}"]}, run_config(thread, f"r{i}"))
            slowest = max(slowest, loop.time() - t1)
            assert out["steps"][-4:] == [f"in{i}", "a", "b", "c"], delay
            record = await saver.aget_run(thread, previous)
            assert record is not None and record.status == "done", delay
            previous = f"r{i}"
        print(
            f"cancel: run length {length * 1000:.1f} ms, {len(delays)} cancel delays "
            f"0..{delays[-1] * 1000:.1f} ms: next run admitted every time "
            f"(slowest next run {slowest * 1000:.0f} ms)",
            flush=True,
        )


_LATE_RETRY = """
import os, sys, time
from tests.contract.test_races import build
from langgraph_deterministic import DeterministicSaver, run_config
db, thread, run, text, go = sys.argv[1:6]
with DeterministicSaver(db) as saver:
    graph = build().compile(checkpointer=saver)
    graph.get_state({"configurable": {"thread_id": "warm"}})
    open(go + ".ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    graph.invoke({"steps": [text]}, run_config(thread, run))
"""


def kills(db: str, tmp: Path, quick: bool) -> None:
    from tests.contract.test_races import _lease, build

    thread = "kill-sweep"
    delays = [0, 2, 5, 10, 20, 40] if quick else [0, 1, 2, 3, 5, 8, 12, 16, 20, 30, 40, 60]
    with DeterministicSaver(db) as saver:
        graph = build().compile(checkpointer=saver)
        graph.invoke({"steps": ["in0"]}, run_config(thread, "r0"))
        previous = "r0"
        for i, ms in enumerate(delays, start=1):
            go = tmp / f"kill-go-{i}"
            proc = subprocess.Popen(
                [sys.executable, "-c", _LATE_RETRY, db, thread, previous, f"in{i - 1}", str(go)],
                stderr=subprocess.PIPE,
            )
            while not Path(f"{go}.ready").exists():
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.01)
            go.touch()
            time.sleep(ms / 1000)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            assert _lease(db, thread) == (previous, "ok"), (ms, _lease(db, thread))
            t0 = time.monotonic()
            out = graph.invoke({"steps": [f"in{i}"]}, run_config(thread, f"r{i}"))
            assert out["steps"][-4:] == [f"in{i}", "a", "b", "c"], ms
            print(f"kill: late retry killed {ms} ms in; next run in {1000 * (time.monotonic() - t0):.0f} ms",
                  flush=True)  # fmt: skip
            previous = f"r{i}"


_TWIN = """
import os, sys, time
from tests.contract.test_races import build, build_journaled
from langgraph_deterministic import DeterministicSaver, run_config
from langgraph_deterministic.errors import ConcurrentRunError
from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal
db, prefix, pairs, journal, tmp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
with DeterministicSaver(db) as saver:
    graph = (build_journaled() if journal else build()).compile(checkpointer=saver)
    runner = DeterministicRunner(journal=PostgresJournal(saver))
    for i in range(pairs):
        go = os.path.join(tmp, f"{prefix}-go-{i}")
        open(f"{go}.ready.{os.getpid()}", "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
        config = run_config(f"{prefix}-{i}", "r1")
        try:
            if journal:
                runner.invoke(graph, {"steps": ["in1"]}, config, durability="sync")
            else:
                graph.invoke({"steps": ["in1"]}, config, durability="sync")
            outcome = "ok"
        except ConcurrentRunError:
            outcome = "ConcurrentRunError"
        done = os.path.join(tmp, f"{prefix}-done-{i}.{os.getpid()}")
        with open(done + ".part", "w") as f:
            f.write(outcome)
        os.replace(done + ".part", done)
"""


def twins(db: str, tmp: Path, quick: bool) -> None:
    from tests.contract.test_races import build, build_journaled
    from tests.contract.test_races import twins as twin_pair

    pairs = 10 if quick else 50
    for journal in (False, True):
        with DeterministicSaver(db) as saver:
            seen = Counter(
                tuple(sorted(twin_pair(saver, f"tt-{journal}-{i}", journal))) for i in range(pairs)
            )
        print(
            f"twins, threads, journal={journal}: {pairs} pairs, outcomes {dict(seen)}", flush=True
        )
    # Two processes, one attempt of each pair each.
    from langgraph_deterministic.runner import DeterministicRunner, PostgresJournal

    for journal in (False, True):
        prefix = f"tp-{int(journal)}"
        with DeterministicSaver(db) as saver:
            graph = (build_journaled() if journal else build()).compile(checkpointer=saver)
            runner = DeterministicRunner(journal=PostgresJournal(saver))

            def call(
                inp: object,
                config: object,
                journal: bool = journal,
                runner: object = runner,
                graph: object = graph,
            ) -> object:
                if journal:
                    return runner.invoke(graph, inp, config, durability="sync")  # type: ignore[attr-defined]
                return graph.invoke(inp, config, durability="sync")  # type: ignore[attr-defined]

            for i in range(pairs):
                call({"steps": ["in0"]}, run_config(f"{prefix}-{i}", "r0"))
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _TWIN,
                        db,
                        prefix,
                        str(pairs),
                        str(int(journal)),
                        str(tmp),
                    ],
                    stderr=subprocess.PIPE,
                )
                for _ in range(2)
            ]
            seen: Counter[tuple[str, ...]] = Counter()
            try:
                _twin_pairs(saver, procs, prefix, pairs, journal, tmp, seen, call)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                    p.wait(60)
        print(f"twins, 2 processes, journal={journal}: {pairs} pairs, outcomes {dict(seen)}",
              flush=True)  # fmt: skip


def _twin_pairs(
    saver: DeterministicSaver,
    procs: list[subprocess.Popen[bytes]],
    prefix: str,
    pairs: int,
    journal: bool,
    tmp: Path,
    seen: Counter[tuple[str, ...]],
    call: Callable[..., Any],
) -> None:
    for i in range(pairs):
        while len(list(tmp.glob(f"{prefix}-go-{i}.ready.*"))) < 2:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.005)
        (tmp / f"{prefix}-go-{i}").touch()
        while len(list(tmp.glob(f"{prefix}-done-{i}.[0-9]*[0-9]"))) < 2:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.005)
        outcomes = tuple(sorted(f.read_text() for f in tmp.glob(f"{prefix}-done-{i}.[0-9]*[0-9]")))
        assert "ok" in outcomes, (i, outcomes)
        seen[outcomes] += 1
        thread = f"{prefix}-{i}"
        record = saver.get_run(thread, "r1")
        assert record is not None and record.lease is not None
        assert record.status == "running" and record.lease.ended == "ok", record
        out = call({"steps": ["in2"]}, run_config(thread, "r2"))
        tail = ["a", "b"] if journal else ["a", "b", "c"]
        assert out["steps"] == ["in0", *tail, "in1", *tail, "in2", *tail], out  # type: ignore[index]
        record = saver.get_run(thread, "r1")
        assert record is not None and record.status == "done"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller matrix")
    parser.add_argument("--only", default="bursts,cancel,kill,twins")
    args = parser.parse_args()
    url, server = ensure_database_url()
    try:
        db = create_database(url, prefix="lgd_trials")
        with DeterministicSaver(db) as saver:
            saver.setup()
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            parts = args.only.split(",")
            if "cancel" in parts:
                asyncio.run(_cancel_sweep(db, args.quick))
            if "kill" in parts:
                kills(db, tmp, args.quick)
            if "twins" in parts:
                twins(db, tmp, args.quick)
            if "bursts" in parts:
                bursts(db, tmp, args.quick)
    finally:
        if server is not None:
            server.stop()
    print("all trials passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
