"""Many failover trials: a primary and a streaming standby on this machine, graph runs in
flight, the primary stopped with ``-m immediate``, the standby promoted, every run retried
until it finishes (``devtools/failover.py``); the counts summed per configuration.

``python benchmarks/failover_trials.py [--trials 20] [--modes sync async]
[--journal on off] [--async-lag-ms 30] [--durability async]``

Exit code 1 when any count that must be zero is not: unfinished runs, non-retryable
errors, ConcurrentRunError (every attempt here is the run's only one), duplicated or
missing inputs, stuck threads, forks, checkpoints with a missing parent. The other
columns are what a failover costs: retries, runs lost whole (async: every write of a
run that had returned fell inside the replication lag; its input is missing), runs
re-opened (a finished run the database lost the end of, or whose lease release it lost;
retried with its run id) and journaled ops run again after their ``durable()`` returned.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from devtools.failover import TrialResult, run_trial

BAD = (
    "unfinished", "fatal", "false_concurrent", "duplicated_inputs", "missing_inputs",
    "stuck_threads", "forks", "missing_parents",
)  # fmt: skip


def _row(results: list[TrialResult]) -> dict[str, Any]:
    row: dict[str, Any] = {k: sum(r.bad()[k] for r in results) for k in BAD}
    row["runs"] = sum(r.runs for r in results)
    row["attempts"] = sum(r.attempts for r in results)
    row["lost_runs"] = sum(r.missing_inputs for r in results) if results[0].mode == "async" else 0
    row["reopened"] = sum(r.reopened_runs for r in results)
    row["ops_rerun"] = sum(r.ops_rerun_after_return for r in results)
    row["unavailable"] = sum(r.errors.get("DatabaseUnavailableError", 0) for r in results)
    row["busy"] = sum(r.errors.get("ThreadBusyError", 0) for r in results)
    row["promote_s"] = max(r.failover_s for r in results)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--modes", nargs="+", default=["sync", "async"])
    parser.add_argument("--journal", nargs="+", default=["on", "off"])
    parser.add_argument("--async-lag-ms", type=float, default=30.0)
    parser.add_argument("--sync-lag-ms", type=float, default=0.0)
    parser.add_argument("--durability", default="async", choices=["sync", "async"])
    args = parser.parse_args(argv)
    failed = False
    print(f"durability={args.durability}, {args.trials} trials per row, 3 threads x 4 runs")
    for mode in args.modes:
        for journal in args.journal:
            lag = args.async_lag_ms if mode == "async" else args.sync_lag_ms
            results = []
            t0 = time.monotonic()
            for i in range(args.trials):
                result = asyncio.run(
                    run_trial(mode, journal=journal == "on", lag_ms=lag, seed=i,
                              durability=args.durability)
                )  # fmt: skip
                results.append(result)
                for line in result.fatal + result.concurrent_messages:
                    print(f"  trial {i}: {line[:300]}", file=sys.stderr)
            row = _row(results)
            bad = {k: row[k] for k in BAD if row[k]}
            failed |= bool(bad)
            print(
                f"{mode:5} lag={lag:g}ms journal={journal:3} "
                + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items())
                + f" wall={time.monotonic() - t0:.0f}s"
                + (f"  BAD {bad}" if bad else "  ok"),
                flush=True,
            )  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
