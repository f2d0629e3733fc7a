"""A/B of the saver's write path against an earlier commit's, in one process.

The put path of DeterministicSaver is the sans-I/O ``_core.put`` / ``_core.put_writes``
(and the release, ``_core.release_lease``) and the SQL they send. This loads them from git
revision ``--base`` (its ``_core.py`` and ``sql/queries.sql``; the plpgsql functions they
call are installed, since migrations only ever add names) and runs whole sync graph runs
of bench_saver's graph (policy ``require``, ``run_config``), each variant on its own
connection (its own backend, LangGraph's connection settings), alternating rep by rep.
Printed per variant, per run: client CPU (this process), server CPU (the variant's
backend, ``/proc/PID/schedstat``), wall time, the server's WAL fsyncs (``pg_stat_wal``,
Postgres 14+), and from a libpq trace of one run: round trips, statements, Parse
messages and KB sent; paired differences to the base by rep.
Needs the base's ``put``/``put_writes`` to take the same arguments as the working tree's
(true since the sans-I/O core, 2026-11).

Run: ``python benchmarks/ab_put_path.py --base main [--runs 10] [--reps 8]``
(``--database-url``, else an embedded Postgres as bench_graph.py uses).

``--replay``: the server side alone. Records the batches this tree sends for one graph
run, then sends them again (fresh thread, run and attempt ids each time) from one
connection per variant, alternating rep by rep: no LangGraph, so the client barely loads
the machine. A variant is this tree's SQL with text swapped (``--swap
v6=lgd_put_checkpoint_v7:lgd_put_checkpoint_v6`` sends every put to the older function);
``--install FILE`` creates experimental functions first. Printed per run: the backend's
CPU, and the server's WAL records, bytes and full-page images (``pg_stat_wal``, PG 14+)
and commits (``pg_stat_database``); only one variant runs at a time, so the server-wide
counters are the variant's (plus autovacuum's). ``--conns N``: each variant's batches go
round-robin over N connections, as a psycopg_pool hands out its idle connections (FIFO);
new backends each time, so the figures include each backend's warm-up (its catalog
caches, plpgsql compiles and first, custom plans per statement shape: with 10
connections and 23 runs, 2.3x the instructions of one backend, callgrind).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
import types
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _src = Path(__file__).resolve().parents[1] / "src"
    if _src.is_dir():
        sys.path.insert(1, str(_src))
    import bench_saver as b
    from cost_breakdown import trace_counts
    from harness import process_cpu_s
else:
    from . import bench_saver as b
    from .cost_breakdown import trace_counts
    from .harness import process_cpu_s

import psycopg
from psycopg.types.json import Jsonb

from devtools.postgres import ensure_database_url
from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.checkpointer import _core, _queries
from langgraph_deterministic.checkpointer._batch import writes_first

ROOT = Path(__file__).resolve().parents[1]
PKG = "src/langgraph_deterministic/checkpointer"


def base_core(rev: str) -> types.ModuleType:
    """``_core`` as of ``rev``, reading ``rev``'s queries.sql."""

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{PKG}/{path}"], cwd=ROOT, check=True,
            capture_output=True, text=True,
        ).stdout  # fmt: skip

    blocks = _queries.named_blocks(show("sql/queries.sql"))
    module = types.ModuleType(f"{_core.__name__}_base")
    module.__dict__["__package__"] = _core.__package__
    exec(compile(show("_core.py"), f"{rev}:_core.py", "exec"), module.__dict__)
    module.__dict__["queries"] = lambda: blocks
    return module


# --- replay: the server side alone -------------------------------------------------------


def record_run(graph: Any) -> list[Any]:
    """The batches one sync graph run of this tree sends, in order."""
    from langgraph_deterministic.checkpointer import _drivers, saver

    batches: list[Any] = []
    execute = _drivers.execute

    def recording(conn: Any, batch: Any) -> Any:
        batches.append(batch)
        return execute(conn, batch)

    saver.execute = recording  # type: ignore[attr-defined]
    try:
        config = b.graph_config("ours")
        graph.invoke(b.graph_input(), config, durability="sync")
    finally:
        saver.execute = execute  # type: ignore[attr-defined]
    return batches


def _swapped(value: Any, swaps: dict[str, str]) -> Any:
    if isinstance(value, str):
        for old, new in swaps.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {_swapped(k, swaps): _swapped(v, swaps) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_swapped(v, swaps) for v in value)
    if isinstance(value, Jsonb):
        return Jsonb(_swapped(value.obj, swaps), value.dumps)
    return value


def replay_batches(batches: list[Any], ids: dict[str, str], sql_swaps: dict[str, str]) -> list[Any]:
    """``batches`` with the run's ids (``ids``: old -> new) swapped in their parameters and
    ``sql_swaps`` in their SQL."""
    out = []
    for batch in batches:
        statements = tuple(
            dataclasses.replace(st, sql=_swapped(st.sql, sql_swaps), params=_swapped(st.params, ids))
            for st in batch.statements
        )
        out.append(dataclasses.replace(batch, statements=statements))
    return out


def _minor_faults(pids: Sequence[int]) -> int:
    """Page faults the backends took without I/O (``/proc/PID/stat`` minflt): a backend
    maps a shared buffer's page on its first touch of it, once per backend."""
    return sum(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
               for pid in pids)  # fmt: skip


def replay(args: argparse.Namespace, url: str) -> None:
    from langgraph_deterministic.checkpointer import _drivers

    with DeterministicSaver(url) as first:
        first.setup()
    admin = psycopg.connect(url, autocommit=True)
    for path in args.install:
        admin.execute(Path(path).read_text())
    conn = psycopg.connect(url, **b.PEER_POOL_KWARGS)
    graph = b.build_graph(False).compile(checkpointer=DeterministicSaver(conn))
    graph.invoke(b.graph_input(), b.graph_config("ours"), durability="sync")  # warm up
    batches = record_run(graph)
    conn.close()
    head = next(st.params for bt in batches for st in bt.statements
                if isinstance(st.params, dict) and "attempt" in st.params)  # fmt: skip
    old_ids = {"thread": head["thread_id"], "run": head["run_id"], "attempt": head["attempt"]}
    variants: dict[str, dict[str, str]] = {"this tree": {}}
    for spec in args.swap:
        name, _, pairs = spec.partition("=")
        variants[name] = dict(p.split(":", 1) for p in pairs.split(","))
    for path in args.swaps_json:  # {"variant": {"old SQL text": "new SQL text", ...}, ...}
        variants.update(json.loads(Path(path).read_text()))
    # --conns N: each variant's batches go round-robin over N connections, as a psycopg_pool
    # hands them out (FIFO: a pool of 10 at one run at a time uses all 10 in turn).
    pools = {name: [psycopg.connect(url, **b.PEER_POOL_KWARGS) for _ in range(args.conns)]
             for name in variants}  # fmt: skip
    conns = {name: p[0] for name, p in pools.items()}
    pids = {name: [c.info.backend_pid for c in p] for name, p in pools.items()}
    print(f"# replay of one graph run ({len(batches)} batches, "
          f"{sum(len(bt.statements) for bt in batches)} statements); backend pids {pids}")  # fmt: skip

    def counters(name: str) -> tuple[float, ...]:
        # A backend sends its statistics at most once a second unless told to at its next
        # transaction's end: flushed so, the server-wide counters include all it did.
        if admin.info.server_version >= 150000:  # else up to a second behind
            conns[name].execute("SELECT pg_stat_force_next_flush()")
        conns[name].execute("SELECT 1")
        admin.execute("SELECT pg_stat_clear_snapshot()")
        row = admin.execute(
            "SELECT w.wal_records, pg_current_wal_insert_lsn() - '0/0'::pg_lsn, w.wal_fpi,"
            " d.xact_commit FROM pg_stat_wal w, pg_stat_database d"
            " WHERE d.datname = current_database()"
        ).fetchone()
        assert row is not None
        return tuple(float(x) for x in row)

    faults: dict[str, list[float]] = defaultdict(list)

    def one_sample(name: str, n: int) -> tuple[float, ...]:
        runs = []
        for _ in range(n):
            suffix = uuid.uuid4().hex
            ids = {v: f"{v}-{suffix}" if k != "attempt" else suffix[:32] for k, v in old_ids.items()}
            runs.append(replay_batches(batches, ids, variants[name]))
        c0 = counters(name)
        f0 = _minor_faults(pids[name])
        s0 = process_cpu_s(pids[name])
        pool, i = pools[name], 0
        for run in runs:
            for batch in run:
                _drivers.execute(pool[i % len(pool)], batch)
                i += 1
        s1 = process_cpu_s(pids[name])
        faults[name].append((_minor_faults(pids[name]) - f0) / n)
        c1 = counters(name)
        assert s0 is not None and s1 is not None, "server CPU needs a local server"
        # the counters' own statements: 2 commits and their WAL (none: read-only)
        c1 = (c1[0], c1[1], c1[2], c1[3] - 2)
        return ((s1 - s0) * 1e3 / n, *((b1 - a1) / n for a1, b1 in zip(c0, c1, strict=True)))

    if args.prefill:  # tables and indexes of a steady size (a fresh btree is one page high)
        with psycopg.connect(url, **b.PEER_POOL_KWARGS) as fill:
            for _ in range(args.prefill):
                suffix = uuid.uuid4().hex
                ids = {v: f"{v}-{suffix}" if k != "attempt" else suffix[:32]
                       for k, v in old_ids.items()}  # fmt: skip
                for batch in replay_batches(batches, ids, {}):
                    _drivers.execute(fill, batch)
    for name in variants:
        one_sample(name, 3)  # warm up: plpgsql compiled, statements prepared
    samples: dict[str, list[tuple[float, ...]]] = defaultdict(list)
    faults.clear()
    for rep in range(args.reps):
        for name in list(variants) if rep % 2 == 0 else list(reversed(variants)):
            samples[name].append(one_sample(name, args.runs))
    print(f"# {args.reps} alternating reps x {args.runs} replayed runs; load average "
          f"{os.getloadavg()[0]:.2f}; per run:")  # fmt: skip
    print(f"{'variant':<16} {'server ms':>10} {'quartiles':>13} {'WAL recs':>9} {'WAL KB':>8} "
          f"{'FPI':>6} {'commits':>8}")  # fmt: skip
    first = None
    for name in variants:
        srv = sorted(x[0] for x in samples[name])
        med = [statistics.median(x[i] for x in samples[name]) for i in range(5)]
        print(f"{name:<16} {med[0]:>10.3f} {srv[len(srv) // 4]:>6.2f}-{srv[(3 * len(srv)) // 4]:<6.2f}"
              f" {med[1]:>9.1f} {med[2] / 1024:>8.1f} {med[3]:>6.1f} {med[4]:>8.1f}")  # fmt: skip
        print(f"{'  minor faults':<16} {statistics.median(faults[name]):>10.1f} (backends')")
        if first is None:
            first = name
        else:
            pairs = list(zip(samples[name], samples[first], strict=True))
            d = sorted(a[0] - c[0] for a, c in pairs)
            print(f"{'  paired diff':<16} {statistics.median(d):>+10.3f} "
                  f"{d[len(d) // 4]:>+6.2f}..{d[(3 * len(d)) // 4]:<+6.2f} (vs {first})")  # fmt: skip
    for c in [*(c for p in pools.values() for c in p), admin]:
        c.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="git revision to compare with")
    parser.add_argument("--runs", type=int, default=10, help="graph runs per sample")
    parser.add_argument("--reps", type=int, default=8, help="alternating samples per variant")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--buffer-writes", type=float, default=0.05,
                        help="DeterministicSaver(buffer_writes=...): raise it under valgrind")
    parser.add_argument("--eager-release", action="store_true",
                        help="also this tree with a release that waits for the WAL flush")
    parser.add_argument("--replay", action="store_true",
                        help="the server side alone: replay one recorded run per variant")
    parser.add_argument("--swap", action="append", default=[],
                        help="--replay variant NAME=OLD:NEW[,OLD:NEW]: this tree's SQL, swapped")
    parser.add_argument("--swaps-json", action="append", default=[],
                        help="--replay variants from a JSON file: {name: {old: new, ...}}")
    parser.add_argument("--prefill", type=int, default=0,
                        help="--replay: runs replayed first, so tables and indexes are not tiny")
    parser.add_argument("--conns", type=int, default=1,
                        help="--replay: connections per variant, used round-robin as a pool's")
    parser.add_argument("--install", action="append", default=[],
                        help="--replay: an SQL file to run first (experimental functions)")
    args = parser.parse_args(argv)
    server = None
    url = args.database_url
    if url is None:
        url, server = ensure_database_url()
    if args.replay:
        try:
            replay(args, url)
        finally:
            if server is not None:
                server.stop()
        return 0
    base = base_core(args.base)

    def base_put(*put_args: Any, pending: Sequence[Any] = ()) -> Any:
        # a base without put(pending=...): the writes go first, as statements of their own
        op = base.put(*put_args)
        return writes_first(op, pending) if pending else op

    def base_release(
        held: Any,
        ended: str,
        *,
        lazy: bool = False,
        interrupted_at: str | None = None,
        stored: bool = True,
    ) -> Any:
        # a base without lazy releases or interrupt marks (no graph here interrupts)
        return base.release_lease(held, ended)

    here = {"put": _core.put, "put_writes": _core.put_writes, "release_lease": _core.release_lease}
    variants: dict[str, dict[str, Callable[..., Any]]] = {
        f"base {args.base}": {
            "put": base_put,
            "put_writes": base.put_writes,
            "release_lease": base_release,
        },
        "this tree": here,
    }
    if args.eager_release:
        release_here = _core.release_lease

        def eager_release(
            held: Any,
            ended: str,
            *,
            lazy: bool = False,
            interrupted_at: str | None = None,
            stored: bool = True,
        ) -> Any:
            # every release waits for the WAL flush
            return release_here(held, ended, interrupted_at=interrupted_at, stored=stored)

        variants["eager release"] = {**here, "release_lease": eager_release}
    try:
        with DeterministicSaver(url) as first:  # migrations, outside the measured backends
            first.setup()
        conns, graphs, pids = {}, {}, {}
        for name in variants:
            conn = psycopg.connect(url, **b.PEER_POOL_KWARGS)  # LangGraph's settings
            saver = DeterministicSaver(conn, buffer_writes=args.buffer_writes)
            saver.setup()
            conns[name], pids[name] = conn, conn.info.backend_pid
            graphs[name] = b.build_graph(False).compile(checkpointer=saver)
        with psycopg.connect(url) as c:
            version = c.execute("SHOW server_version").fetchone()
        print(f"# backend pids: {pids}")
        print(f"# Postgres {version[0] if version else '?'}; {args.reps} alternating reps "
              f"x {args.runs} sync graph runs per variant")  # fmt: skip

        def use(name: str) -> None:
            for attr, fn in variants[name].items():
                setattr(_core, attr, fn)

        def runs(name: str, n: int) -> Callable[[], None]:
            configs = [b.graph_config("ours") for _ in range(n)]

            def go() -> None:
                for config in configs:
                    graphs[name].invoke(b.graph_input(), config, durability="sync")

            return go

        counts = {}
        for name in variants:
            use(name)
            runs(name, 3)()  # warm up: plpgsql compiled, statements prepared
            counts[name] = trace_counts(conns[name], runs(name, 1))
        samples: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        syncs: dict[str, list[tuple[float, ...]]] = defaultdict(list)
        admin = psycopg.connect(url, autocommit=True)

        flush_stats = admin.info.server_version >= 150000  # pg_stat_force_next_flush()

        def wal_counts(name: str) -> tuple[float, ...]:
            """Server-wide WAL fsyncs (the walwriter's too), WAL records and bytes: only
            one variant runs at a time. Its backend sends its statistics at the end of its
            next transaction when told to (else at most once a second)."""
            if flush_stats:
                conns[name].execute("SELECT pg_stat_force_next_flush()")
            admin.execute("SELECT pg_stat_clear_snapshot()")
            row = admin.execute(
                "SELECT wal_sync, wal_records, pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
                " FROM pg_stat_wal"
            ).fetchone()
            return tuple(float(x) for x in row) if row else (0.0, 0.0, 0.0)

        for rep in range(args.reps):
            order = list(variants) if rep % 2 == 0 else list(reversed(variants))
            for name in order:
                use(name)
                go = runs(name, args.runs)
                w0 = wal_counts(name)
                s0, c0 = process_cpu_s([pids[name]]), time.process_time()
                t0 = time.perf_counter()
                go()
                t1, c1, s1 = time.perf_counter(), time.process_time(), process_cpu_s([pids[name]])
                w1 = wal_counts(name)
                syncs[name].append(tuple((b1 - a1) / args.runs for a1, b1 in zip(w0, w1, strict=True)))
                assert s0 is not None and s1 is not None, "server CPU needs a local server"
                per = 1e3 / args.runs
                samples[name].append(((c1 - c0) * per, (s1 - s0) * per, (t1 - t0) * per))
        for attr, fn in here.items():
            setattr(_core, attr, fn)
        print(f"{'variant':<16} {'client ms':>10} {'server ms':>10} {'srv spread':>12} "
              f"{'rt':>4} {'stmts':>6} {'parse':>6} {'KB out':>7} {'wall ms':>8} "
              f"{'fsyncs':>6} {'WAL recs':>8} {'WAL KB':>7}")  # fmt: skip
        first = None
        for name in variants:
            cli = statistics.median(x[0] for x in samples[name])
            srvs = sorted(x[1] for x in samples[name])
            srv = statistics.median(srvs)
            wall = statistics.median(x[2] for x in samples[name])
            k = counts[name]
            print(f"{name:<16} {cli:>10.2f} {srv:>10.2f} {srvs[0]:>5.2f}-{srvs[-1]:<6.2f} "
                  f"{k['rt']:>4.0f} {k['stmts']:>6.0f} {k['parse']:>6.0f} {k['kb_out']:>7.1f} "
                  f"{wall:>8.2f} {statistics.median(x[0] for x in syncs[name]):>6.1f} "
                  f"{statistics.median(x[1] for x in syncs[name]):>8.1f} "
                  f"{statistics.median(x[2] for x in syncs[name]) / 1024:>7.1f}")  # fmt: skip
            if first is None:
                first = name
            else:  # paired by rep: the two samples of a rep ran back to back
                pairs = list(zip(samples[name], samples[first], strict=True))
                d_cli = statistics.median(a[0] - b_[0] for a, b_ in pairs)
                d_wall = statistics.median(a[2] - b_[2] for a, b_ in pairs)
                d_srv = sorted(a[1] - b_[1] for a, b_ in pairs)
                print(f"{'  paired diff':<16} {d_cli:>+10.2f} {statistics.median(d_srv):>+10.2f} "
                      f"{d_srv[len(d_srv) // 4]:>+5.2f}..{d_srv[(3 * len(d_srv)) // 4]:<+6.2f}"
                      f" (median, quartiles); wall {d_wall:+.2f}")  # fmt: skip
        for conn in [*conns.values(), admin]:
            conn.close()
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
