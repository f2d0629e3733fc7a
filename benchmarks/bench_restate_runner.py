"""Benchmark DeterministicRunner on a real restate-server.

Workload: 4 parallel branches x 4 sequential durable ops; op j of branch i takes
400 ms if i == j else 50 ms, so each branch has one slow call at a different moment.
Ideal parallel time is the longest branch (550 ms); fully serialised calls take 2200 ms;
a per-round barrier (wait for every branch's op before the next round) gives ~4 x 400 ms.

Also: per-op overhead of ``durable()`` in a sequential node against a bare
``ctx.run_typed`` in a sequential handler (no-op ops, so what is left is overhead).

Run:  .venv/bin/python benchmarks/bench_restate_runner.py [--runs 7] [--forced-replay]
It fetches restate-server from npm like the tests do (tests/runner/restate_server.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.runner (--stress)

from restate_server import RestateEnv, ensure_binary

IDEAL_S = 0.55
SERIAL_S = 2.2
BARRIER_S = 1.6


def run(env: RestateEnv, handler: str, body: dict[str, object]) -> tuple[float, dict[str, object]]:
    t0 = time.perf_counter()
    status, out = env.call(handler, {**body, "id": uuid.uuid4().hex}, timeout=120)
    wall = time.perf_counter() - t0
    if status != 200 or not isinstance(out, dict):
        raise RuntimeError(f"{handler} failed: {status} {out}")
    return wall, out


def stress(n: int, only: list[str] | None = None, regimes: str = "both") -> None:
    """Run each graph shape n times per regime; count 570 journal mismatches, hangs, side
    effects that finished more than once, and (without forced replay, where nothing ends
    an attempt early) invocations that needed more than one attempt: Restate retries a
    failed attempt and clears its failure once the invocation completes, so a status 200
    alone can hide a driver error."""
    import json
    import tempfile

    from tests.runner.test_restate_e2e import SHAPES

    shapes = [*sorted(SHAPES), "fanout_ctx", "naive"]
    if only:
        unknown = sorted(set(only) - set(shapes))
        if unknown:
            raise SystemExit(f"unknown shapes {unknown}; valid: {', '.join(shapes)}")
        shapes = [s for s in shapes if s in only]
    rows = []
    chosen = {"both": (True, False), "forced": (True,), "plain": (False,)}[regimes]
    for regime, forced in (("forced replay", True), ("no forced replay", False)):
        if forced not in chosen:
            continue
        env = RestateEnv(ensure_binary(), forced_replay=forced).start()
        try:
            for shape in shapes:
                ok = mismatch = hang = other = retried = twice = 0
                for _ in range(n):
                    eff = Path(tempfile.mktemp(prefix="lgd-effects-"))
                    iid = env.send(shape, {"effects": str(eff), "gate": None,
                                           "id": uuid.uuid4().hex})  # fmt: skip
                    try:
                        status, _out = env.attach(iid, timeout=15)
                    except TimeoutError:
                        status = -1
                    inv = env.server.query(
                        "select status, last_failure_error_code, last_failure from sys_invocation "
                        f"where id = '{iid}'"
                    )[0]
                    failed_570 = inv.get("last_failure_error_code") == 570 or "570" in json.dumps(
                        inv.get("last_failure") or ""
                    )
                    lines = eff.read_text().splitlines() if eff.exists() else []
                    eff.unlink(missing_ok=True)
                    done = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("done ")]
                    tags = {ln.split(" ", 2)[2] for ln in lines if ln.startswith("attempt ")}
                    twice += len(done) != len(set(done))
                    retried += not forced and len(tags) > 1
                    if status == 200 and not failed_570:
                        ok += 1
                    elif failed_570:
                        mismatch += 1
                    elif status == -1:
                        hang += 1
                    else:
                        other += 1
                    if status != 200:  # stop retrying it
                        http_kill(env, iid)
                rows.append((regime, shape, n, ok, mismatch, hang, other, twice,
                             "-" if forced else retried))  # fmt: skip
        finally:
            env.stop()
    print("\n| regime | graph | runs | ok | 570 mismatch | hang (>15 s) | other "
          "| an effect done twice | > 1 attempt |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print("\n('naive' = the fanout_ctx graph run with plain graph.ainvoke, no runner)")


def http_kill(env: RestateEnv, iid: str) -> None:
    from restate_server import http

    http("PATCH", f"{env.server.admin}/invocations/{iid}/kill")
    http("DELETE", f"{env.server.admin}/invocations/{iid}?mode=kill")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="measured runs per workload (default 7)")
    ap.add_argument(
        "--seq-ops",
        type=int,
        default=50,
        help="no-op durable ops per run of the per-op overhead workload (default 50)",
    )
    ap.add_argument(
        "--forced-replay",
        action="store_true",
        help="inactivity-timeout 0s: suspend + replay after every durable step",
    )
    ap.add_argument(
        "--stress",
        type=int,
        default=0,
        help="instead: run every graph shape N times per regime, count failures",
    )
    ap.add_argument(
        "--shapes",
        default="",
        help="with --stress: comma-separated subset of the graph shapes (default all)",
    )
    ap.add_argument(
        "--regimes",
        choices=["both", "forced", "plain"],
        default="both",
        help="with --stress: with forced replay, without, or both (default)",
    )
    args = ap.parse_args()
    if args.stress:
        stress(args.stress, [s for s in args.shapes.split(",") if s] or None, args.regimes)
        return

    env = RestateEnv(ensure_binary(), forced_replay=args.forced_replay).start()
    try:
        run(env, "bench", {})  # warm up: imports, graph compile, deployment discovery
        run(env, "bench_bare", {"n": 5})
        run(env, "bench_runner_seq", {"n": 5})

        client, inner, decisions = [], [], []
        for _ in range(args.runs):
            wall, out = run(env, "bench", {})
            client.append(wall)
            inner.append(float(out["elapsed"]))  # type: ignore[arg-type]
            decisions.append(int(out["decisions"]))  # type: ignore[call-overload]
        bare, routed, bare_client, routed_client = [], [], [], []
        n = args.seq_ops
        for _ in range(args.runs):
            wall, out = run(env, "bench_bare", {"n": n})
            bare.append(float(out["elapsed"]) / n)  # type: ignore[arg-type]
            bare_client.append(wall / n)
            wall, out = run(env, "bench_runner_seq", {"n": n})
            routed.append(float(out["elapsed"]) / n)  # type: ignore[arg-type]
            routed_client.append(wall / n)
    finally:
        env.stop()

    med = statistics.median
    regime = "forced replay (inactivity-timeout 0s)" if args.forced_replay else "no forced replay"
    print(f"\nrestate-server 1.7.12, {regime}, {args.runs} runs, medians\n")
    if args.forced_replay:
        print(
            "Under forced replay each durable step ends the attempt; 'inside the handler'\n"
            "covers only the last attempt (a full replay), the client figure covers all.\n"
        )
    print(
        "| 4 branches x 4 ops (one 400 ms op each) | wall | vs ideal 550 ms | vs serial 2200 ms |"
    )
    print("|---|---|---|---|")
    for label, xs in (
        ("graph run inside the handler", inner),
        ("client round trip (ingress -> result)", client),
    ):
        m = med(xs)
        print(f"| {label} | {m * 1000:.0f} ms | {m / IDEAL_S:.2f}x | {m / SERIAL_S:.2f}x |")
    print(
        f"| per-round barrier (reference) | {BARRIER_S * 1000:.0f} ms | "
        f"{BARRIER_S / IDEAL_S:.2f}x | {BARRIER_S / SERIAL_S:.2f}x |"
    )
    print(
        f"\nscheduling decisions journaled per run: median {med(decisions):.0f} for 16 ops; "
        f"graph time in handler {min(inner) * 1000:.0f}..{max(inner) * 1000:.0f} ms"
    )
    print(f"\n| sequential no-op ops ({n} per run) | per op, in handler | per op, client |")
    print("|---|---|---|")
    print(
        f"| bare ctx.run_typed in a handler | {med(bare) * 1000:.2f} ms | "
        f"{med(bare_client) * 1000:.2f} ms |"
    )
    print(
        f"| durable() in a DeterministicRunner node | {med(routed) * 1000:.2f} ms | "
        f"{med(routed_client) * 1000:.2f} ms |"
    )
    print(
        f"| overhead per op | {(med(routed) - med(bare)) * 1000:.2f} ms | "
        f"{(med(routed_client) - med(bare_client)) * 1000:.2f} ms |"
    )


if __name__ == "__main__":
    main()
