"""Client CPU of bench_saver.py's graph run, per saver: h-client's profiling tool (issue 13).

One process, one side, one mode; it prints one JSON line per measured block. Made to be
run many times (alternating sides or code versions) and under valgrind:

```
python benchmarks/profile_client.py prepare                  # a database; prints its DSN
python benchmarks/profile_client.py run --dsn DSN --side ours --mode async -c 32 --runs 64
python benchmarks/profile_client.py run ... --net 1ms          # through delay_proxy.py
python benchmarks/profile_client.py run ... --cprofile out.prof  # every thread, merged
python benchmarks/profile_client.py run ... --src /tmp/base/src  # another checkout's code
PROFILE_CLIENT_CGCTL=cgctl.so valgrind --tool=callgrind --callgrind-out-file=cg.%p \
    python benchmarks/profile_client.py run ... --buffer-writes 30
python benchmarks/profile_client.py instructions --dsn DSN   # the above, for every side
python benchmarks/profile_client.py instructions --dsn DSN --server-dumps DIR  # + server
```

Under callgrind, ``$PROFILE_CLIENT_CGCTL`` names a shared library exporting ``cg_zero`` and
``cg_dump`` (``CALLGRIND_ZERO_STATS`` / ``CALLGRIND_DUMP_STATS`` from
``<valgrind/callgrind.h>``, one line each; ``gcc -shared -fPIC``): each measured block is
then dumped on its own (``cg.PID.1``, ...), warm-up and start-up excluded, every thread
counted; instructions per run = the dump's total Ir / runs. Give ours a long
``--buffer-writes`` there: callgrind slows a run ~50x, so the write buffer's 0.05 s window
would run out in every superstep and store the writes on their own.

``instructions`` does that for every side (building the library from ``CGCTL_C``) and
prints instructions per run side by side. With ``--server-dumps DIR`` it counts the
server's too, from a Postgres run as ``valgrind --tool=callgrind --trace-children=yes
--callgrind-out-file=DIR/cg.%p postgres -D ... -c autovacuum=off``: each side runs twice
more over a pool of one, and the difference of the two backends' counts, per run, is the
server's work for one run (start-up and warm-up cancel).

Sides: ``ours`` (DeterministicSaver, policy require, ``run_config``), ``peer``
(PostgresSaver / AsyncPostgresSaver), ``floor`` (floor.py's FloorSaver), ``floor_fenced``
(its FencedFloorSaver, the contract's floor, with ``fenced_config``), ``memory``
(InMemorySaver, a fresh one per block). Postgres sides share one pool of ``--pool-size``
connections with LangGraph's settings, as in bench_graph.py. ``--mode async -c N`` runs
N tasks on one event loop, each running its share of the runs one after another (as
bench_graph.py's graph_async_cN). CPU is ``getrusage(RUSAGE_SELF)``: every thread of this
process, user and system; the proxy runs in a child process and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import resource
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


class _AllThreads:
    """cProfile in every thread started while enabled (LangGraph's executor threads run
    the sync saver's calls), plus the calling thread; merged into one stats file."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        # thread CPU time, not wall time: a thread waiting (or descheduled) adds nothing
        prof = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append(prof)
        prof.enable()

    def enable(self) -> None:
        threading.setprofile(self._hook)
        self._hook(None, "", None)

    def disable(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        for prof in self.profiles:
            prof.disable()  # only stops the calling thread's; the others end with the runs

    def dump(self, path: str) -> None:
        stats = pstats.Stats(self.profiles[0])
        for prof in self.profiles[1:]:
            with contextlib.suppress(TypeError):  # a thread that profiled nothing
                stats.add(prof)
        stats.dump_stats(path)


class _NoCallgrind:
    def cg_zero(self) -> None:
        pass

    def cg_dump(self) -> None:
        pass


def _callgrind() -> Any:
    """Callgrind's client requests, from a small library named by $PROFILE_CLIENT_CGCTL
    (see the module docstring), or no-ops."""
    path = os.environ.get("PROFILE_CLIENT_CGCTL")
    if not path:
        return _NoCallgrind()
    import ctypes

    return ctypes.CDLL(path)


def prepare(url: str | None) -> str:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    from devtools.postgres import create_database, ensure_database_url
    from langgraph_deterministic import DeterministicSaver

    if url is None:
        url, _server = ensure_database_url()
    dsn = create_database(url, prefix="lgd_profile_client")
    with psycopg.connect(dsn, autocommit=True) as conn:
        DeterministicSaver(conn).setup()
    import bench_saver as b

    with psycopg.connect(dsn, **b.PEER_POOL_KWARGS) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
    return dsn


#: timed stores of ours' write buffer (a superstep's writes that waited out the window)
TIMED_STORES = [0]


def _saver(side: str, conn: Any, buffer_writes: float) -> Any:
    import bench_saver as b

    if side in ("floor", "floor_fenced"):
        from floor import floor_saver

        return floor_saver(side, conn)
    if side != "ours":
        return b.graph_saver(side, conn)
    from langgraph_deterministic import DeterministicSaver

    saver = DeterministicSaver(conn, run_id_policy="require", buffer_writes=buffer_writes)
    buffer = saver._writes
    if buffer is not None:  # count them: each is a transaction of its own
        store, astore = buffer._store, buffer._astore

        def counted(statements: Any) -> Any:
            TIMED_STORES[0] += 1
            return store(statements)

        async def acounted(statements: Any) -> Any:
            TIMED_STORES[0] += 1
            return await astore(statements)

        buffer._store, buffer._astore = counted, acounted
    return saver


def run(args: argparse.Namespace) -> None:
    from psycopg.conninfo import make_conninfo
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    import bench_saver as b
    import delay_proxy
    import langgraph_deterministic

    dsn = args.dsn
    stop_proxy = None
    if args.net == "1ms":
        from bench_graph import unix_socket

        unix, host, port = unix_socket(dsn)
        proxy_port, stop_proxy = delay_proxy.start(unix=unix, host=host, port=port, rtt_ms=1.0)
        dsn = make_conninfo(dsn, host="127.0.0.1", port=str(proxy_port))
    sync = args.mode == "sync"
    kwargs = dict(b.PEER_POOL_KWARGS)
    kwargs["prepare_threshold"] = (
        None if args.prepare_threshold.lower() == "none" else int(args.prepare_threshold)
    )
    meta = {
        "side": args.side, "mode": args.mode, "c": args.concurrency, "net": args.net,
        "src": str(Path(langgraph_deterministic.__file__).parents[1]),
        "prepare_threshold": kwargs["prepare_threshold"],
        "load": os.getloadavg()[0],
    }  # fmt: skip

    def graph_for(conn: Any) -> Any:
        if args.side == "memory":
            return b.build_graph(not sync).compile(checkpointer=b.graph_saver("memory"))
        return b.build_graph(not sync).compile(
            checkpointer=_saver(args.side, conn, args.buffer_writes)
        )

    def config() -> Any:
        if args.side == "ours":
            return b.graph_config("ours")
        if args.side == "floor_fenced":
            from floor import fenced_config

            return fenced_config(f"floor_fenced-{uuid.uuid4()}", str(uuid.uuid4()))
        thread_id, run_id = f"{args.side}-{uuid.uuid4()}", str(uuid.uuid4())
        return {"configurable": {"thread_id": thread_id}, "metadata": {"run_id": run_id}}

    prof = _AllThreads() if args.cprofile else None
    cg = _callgrind()

    @contextlib.contextmanager
    def measured(block: int, runs: int) -> Iterator[None]:
        """One measured block of ``runs`` graph runs: profiled, dumped under callgrind, and
        printed as one JSON line."""
        gc.collect()
        if prof is not None:
            prof.enable()
        cg.cg_zero()
        t0, (u0, s0) = time.perf_counter(), _cpu()
        yield
        t1, (u1, s1) = time.perf_counter(), _cpu()
        cg.cg_dump()
        if prof is not None:
            prof.disable()
        user, system = u1 - u0, s1 - s0
        timed, TIMED_STORES[0] = TIMED_STORES[0], 0
        n = max(1, runs)
        print(json.dumps({**meta, "block": block, "runs": runs,
                          "cpu_ms": round((user + system) * 1e3 / n, 3),
                          "user_ms": round(user * 1e3 / n, 3), "sys_ms": round(system * 1e3 / n, 3),
                          "wall_ms": round((t1 - t0) * 1e3 / n, 3),
                          "timed_stores_per_run": round(timed / n, 3)}), flush=True)  # fmt: skip

    if sync:
        pool: Any = ConnectionPool(
            dsn, min_size=args.pool_size, max_size=args.pool_size,
            kwargs=kwargs, open=False,
        )  # fmt: skip
        pool.open(wait=True, timeout=30)
        graph = graph_for(pool)

        def runs(n: int) -> None:
            nonlocal graph
            if args.side == "memory":  # fresh per block: InMemorySaver keeps everything
                graph = graph_for(None)
            for _ in range(n):
                out = graph.invoke(b.graph_input(), config(), durability="sync")
                assert len(out["messages"]) == b.EXPECTED_MESSAGES

        runs(args.warm)
        TIMED_STORES[0] = 0
        for block in range(args.blocks):
            with measured(block, args.runs):
                runs(args.runs)
        pool.close()
    else:

        async def main() -> None:
            apool: Any = AsyncConnectionPool(
                dsn, min_size=args.pool_size, max_size=args.pool_size,
                kwargs=kwargs, open=False,
            )  # fmt: skip
            await apool.open(wait=True, timeout=30)
            graph = graph_for(apool)

            async def runs(n: int) -> None:
                nonlocal graph
                if args.side == "memory":  # fresh per block: InMemorySaver keeps everything
                    graph = graph_for(None)
                per_task = n // args.concurrency

                async def task() -> None:
                    for _ in range(per_task):
                        out = await graph.ainvoke(b.graph_input(), config(), durability="sync")
                        assert len(out["messages"]) == b.EXPECTED_MESSAGES

                await asyncio.gather(*(task() for _ in range(args.concurrency)))

            await runs(args.warm * args.concurrency)
            TIMED_STORES[0] = 0
            for block in range(args.blocks):
                with measured(block, args.runs - args.runs % args.concurrency):
                    await runs(args.runs)
            await apool.close()

        asyncio.run(main())
    if prof is not None:
        prof.dump(args.cprofile)
    if stop_proxy is not None:
        stop_proxy()


SIDES = ("memory", "floor", "floor_fenced", "ours", "peer")
#: callgrind's client requests, built into a library for $PROFILE_CLIENT_CGCTL
CGCTL_C = """#include <valgrind/callgrind.h>
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(void) { CALLGRIND_DUMP_STATS; }
"""


def _ir(path: Path) -> int:
    """The instructions a callgrind dump counted (its ``summary:`` line)."""
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"{path}: no summary line (did callgrind finish?)")


def _run_argv(args: argparse.Namespace, side: str, runs: int, pool_size: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "run", "--dsn", args.dsn,
            "--side", side, "--mode", args.mode, "--runs", str(runs), "--warm",
            str(args.warm), "--pool-size", str(pool_size), "--buffer-writes", "30"]  # fmt: skip


def instructions(args: argparse.Namespace) -> int:
    """Instructions per graph run, per side: the client under callgrind (each measured
    block dumped on its own, warm-up and start-up excluded); with ``--server-dumps``, the
    server's too. Counts, unlike CPU time, do not move with the machine's load."""
    import shutil
    import subprocess
    import tempfile

    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        print("instructions needs valgrind (with <valgrind/callgrind.h>) and a C compiler: "
              "apt-get install valgrind gcc", file=sys.stderr)  # fmt: skip
        return 2
    if args.server_dumps is not None and args.runs < 4:
        print("--server-dumps needs --runs >= 4 (it subtracts a run of a quarter as many)",
              file=sys.stderr)  # fmt: skip
        return 2
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        print(f"unknown sides {unknown}; choose from {', '.join(SIDES)}", file=sys.stderr)
        return 2
    table: dict[str, tuple[float, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="lgd-instructions-") as tmp:
        lib = Path(tmp) / "cgctl.so"
        (Path(tmp) / "cgctl.c").write_text(CGCTL_C)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(Path(tmp) / "cgctl.c")],
                       check=True)  # fmt: skip
        env = {**os.environ, "PROFILE_CLIENT_CGCTL": str(lib)}
        for side in sides:
            out = Path(tmp) / f"client-{side}"
            # Callgrind slows a run ~50x: ours' write window (30 s here) must not run out.
            subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", "-q",
                 *_run_argv(args, side, args.runs, args.pool_size)],
                env=env, check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            (dump,) = Path(tmp).glob(f"client-{side}.*.1")  # the one measured block
            client = _ir(dump) / args.runs
            server = None if args.server_dumps is None else _server_ir(args, side)
            table[side] = (client, server)
            print(f"  {side}: client {client / 1e6:.2f}M"
                  + ("" if server is None else f", server {server / 1e6:.2f}M")
                  + " instructions per run", file=sys.stderr, flush=True)  # fmt: skip
    print(f"instructions per {args.mode} graph run (callgrind; client: {args.runs} runs after "
          f"{args.warm} warm-up; server: one backend, the difference of two runs' counts)")  # fmt: skip
    print(f"{'side':<14} {'client':>9} {'server':>9} {'total':>9} {'vs peer':>8}")
    peer = table.get("peer")
    for side, (client, server) in table.items():
        total = client + (server or 0.0)
        ratio = ""
        if peer is not None and (server is None) == (peer[1] is None):
            ratio = f"{total / (peer[0] + (peer[1] or 0.0)):.3f}x"
        srv = "-" if server is None else f"{server / 1e6:.2f}M"
        print(f"{side:<14} {client / 1e6:>8.2f}M {srv:>9} {total / 1e6:>8.2f}M {ratio:>8}")
    return 0


def _server_ir(args: argparse.Namespace, side: str) -> float | None:
    """The server's instructions per run of ``side``: two runs of it over a pool of one
    (``--runs`` and a quarter of it), each a backend of its own under the callgrind the
    server runs in, which writes the backend's counts to ``--server-dumps`` when it exits;
    their difference per run cancels the backend's start-up and warm-up."""
    import subprocess
    import time

    if side == "memory":
        return None
    dumps = Path(args.server_dumps)

    def settled() -> set[Path]:
        """The directory once no backend is still writing its dump (backends of earlier
        runs exit after their process has returned)."""
        seen: dict[Path, int] = {}
        for _ in range(100):
            now = {p: p.stat().st_size for p in dumps.iterdir()}
            if now == seen and all(_has_summary(p) for p in now if p.stat().st_size):
                return set(now)
            seen = now
            time.sleep(0.3)
        raise SystemExit(f"the dumps in {dumps} kept changing for 30 s")

    counts = []
    small = args.runs // 4
    for runs in (small, args.runs):
        before = settled()
        subprocess.run(_run_argv(args, side, runs, 1), check=True, stdout=subprocess.DEVNULL)
        new = [p for p in settled() - before if not p.name.endswith(".1")]
        if len(new) != 1:
            raise SystemExit(f"expected one new backend dump in {dumps}, found {len(new)}: "
                             "is the server running under callgrind, writing there?")  # fmt: skip
        counts.append(_ir(new[0]))
    return (counts[1] - counts[0]) / (args.runs - small)


def _has_summary(path: Path) -> bool:
    with path.open("rb") as f:
        return any(line.startswith(b"summary:") for line in f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="create a database with both savers' tables")
    p.add_argument("--url", default=os.environ.get("DATABASE_URL"))
    r = sub.add_parser("run", help="measure one side")
    r.add_argument("--dsn", required=True)
    r.add_argument("--side", choices=SIDES, default="ours")
    r.add_argument("--mode", choices=("sync", "async"), default="sync")
    r.add_argument("-c", "--concurrency", type=int, default=1)
    r.add_argument("--runs", type=int, default=30, help="runs per measured block")
    r.add_argument("--blocks", type=int, default=1)
    r.add_argument("--warm", type=int, default=3, help="warm-up runs (per task)")
    r.add_argument("--net", choices=("direct", "1ms"), default="direct")
    r.add_argument("--pool-size", type=int, default=10)
    r.add_argument("--buffer-writes", type=float, default=0.05, help="ours' write window")
    r.add_argument(
        "--prepare-threshold", default="0",
        help="the pool's prepare_threshold (LangGraph's 0; 'none': never prepare)",
    )  # fmt: skip
    r.add_argument("--cprofile", default=None, help="write a merged cProfile here")
    r.add_argument("--src", default=None, help="import langgraph_deterministic from here")
    i = sub.add_parser("instructions", help="instructions per run of each side (callgrind)")
    i.add_argument("--dsn", required=True)
    i.add_argument("--sides", default=",".join(SIDES))
    i.add_argument("--mode", choices=("sync", "async"), default="async")
    i.add_argument("--runs", type=int, default=12, help="measured runs per side")
    i.add_argument("--warm", type=int, default=4, help="warm-up runs")
    i.add_argument("--pool-size", type=int, default=10)
    i.add_argument(
        "--server-dumps", default=None,
        help="the directory the server, run under callgrind, writes its backends' dumps to",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.cmd == "instructions":
        return instructions(args)
    if args.cmd == "prepare":
        print(prepare(args.url))
        return 0
    return run(args) or 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    pre = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else None
    sys.path[:0] = [p for p in (pre, str(here), str(here.parent)) if p]
    import langgraph_deterministic  # noqa: F401  # now: bench_saver puts this checkout's src first

    sys.exit(main())
