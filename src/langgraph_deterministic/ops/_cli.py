"""The ``audit`` and ``repair`` subcommands: argument parsing and output only."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_deterministic.ops.audit import AuditReport
    from langgraph_deterministic.ops.repair import RepairReport

from langgraph_deterministic.ops import DEFAULT_IDLE, STATEMENT_TIMEOUT_MS

# audit and repair (LangChain, LangGraph's serde, rich) are imported when they run, so that
# every other subcommand starts as fast as before


def _time(text: str) -> datetime:
    """An ISO date/time (this machine's local time unless it names a zone: 2026-11-30T08:00Z,
    ...+01:00), or a duration back from now: 30m, 6h, 2d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].isdigit():
        return datetime.now().astimezone() - timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO time (2026-11-30T08:00) nor a duration (30m, 6h, 2d)"
        ) from None
    return when if when.tzinfo else when.astimezone()


def _seconds(text: str) -> timedelta:
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def _pause(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _duty(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share of the time in (0, 1]")
    return value


def add_parsers(sub: Any) -> None:
    a = sub.add_parser("audit", help="find threads that retries damaged (read-only)")
    a.add_argument("--dsn")
    a.add_argument("--json", action="store_true", help="print a JSON report")
    a.add_argument("--thread", help="audit one thread only")
    a.add_argument("--since", type=_time, help="only threads written since TIME (ISO, or 6h, 2d)")
    a.add_argument(
        "--idle", type=_seconds, default=DEFAULT_IDLE,
        help=f"seconds a thread with a step left must be quiet to count as stuck (default {int(DEFAULT_IDLE.total_seconds())})",
    )  # fmt: skip
    a.add_argument(
        "--statement-timeout", type=int, default=STATEMENT_TIMEOUT_MS,
        help=f"per-statement limit in ms; a slower range is split (default {STATEMENT_TIMEOUT_MS})",
    )  # fmt: skip
    a.add_argument(
        "--pause", type=_pause, default=None, metavar="SECONDS",
        help="sleep between ranges (0: full speed); default: automatic, full speed on a quiet "
        "database, and beside live workers (WAL growing) a wait that keeps the scan to "
        "--duty of the time (0.25: three times as long as each range took)",
    )  # fmt: skip
    a.add_argument(
        "--duty", type=_duty, default=None, metavar="SHARE",
        help="automatic pace: the share of the time the scan may run beside live workers "
        "(default 0.25; lower is gentler and slower)",
    )  # fmt: skip
    a.add_argument(
        "--priority", choices=("idle", "normal"), default="idle",
        help="CPU priority of the audit, and of its server backend when the server runs on "
        "this machine (default idle: live workers preempt it at once; Linux SCHED_IDLE)",
    )  # fmt: skip
    r = sub.add_parser("repair", help="fix what audit found (dry run unless --apply)")
    r.add_argument("--dsn")
    r.add_argument("--apply", action="store_true", help="write the repairs")
    r.add_argument("--json", action="store_true", help="print a JSON report")
    r.add_argument("--thread", help="repair one thread only")
    r.add_argument("--idle", type=_seconds, default=DEFAULT_IDLE,
                   help="seconds a thread with a step left must be quiet to count as stuck, as audit's")  # fmt: skip


def run_audit(args: argparse.Namespace, dsn: str) -> int:
    from langgraph_deterministic.ops.audit import audit

    progress, done = _progress("auditing checkpoints", enabled=not args.json)
    try:
        report = audit(
            dsn, thread_id=args.thread, since=args.since, idle=args.idle,
            statement_timeout_ms=args.statement_timeout, progress=progress, pause=args.pause,
            duty=args.duty, priority=args.priority,
        )  # fmt: skip
    finally:
        done()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_audit(report)
    return report.exit_code


def run_repair(args: argparse.Namespace, dsn: str) -> int:
    from langgraph_deterministic.ops.repair import repair

    report = repair(dsn, apply=args.apply, thread_id=args.thread, idle=args.idle)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_repair(report)
    return report.exit_code


def _progress(label: str, *, enabled: bool) -> tuple[Any, Any]:
    if not enabled or not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), transient=True,
    )  # fmt: skip
    bar.start()
    task = bar.add_task(label, total=None)

    def update(n: int, total: int | None) -> None:
        bar.update(task, completed=n, total=max(total, n) if total else None)

    return update, bar.stop


def _print_audit(report: AuditReport) -> None:
    from rich.console import Console
    from rich.table import Table

    from langgraph_deterministic.ops.audit import FAULTS

    console = Console(highlight=False)
    console.print(
        f"scanned {report.threads} threads, {report.checkpoints} checkpoints in "
        f"{report.seconds:.1f} s ({report.active_threads} with a run in progress, skipped)"
        + (
            f"; {report.paused_seconds:.1f} s of it paused for live workers"
            if report.paused_seconds
            else ""
        )
    )
    counts = report.counts()
    summary = Table("fault", "threads", "meaning")
    for name, fault in FAULTS.items():
        label = name if fault.severity == "damage" else f"{name} (risk)"
        summary.add_row(label, str(counts[name]), fault.meaning)
    console.print(summary)
    damaged = report.damaged
    if damaged:
        table = Table("thread", "faults", "where")
        for thread_id, found in sorted(damaged.items())[:50]:
            table.add_row(
                thread_id,
                ", ".join(sorted({f.fault for f in found})),
                "; ".join(sorted({f.detail for f in found}))[:120],
            )
        console.print(table)
        if len(damaged) > 50:
            console.print(f"... and {len(damaged) - 50} more (use --json for all)")
        console.print("damage found: `langgraph-deterministic repair` shows the fixes.")
    else:
        console.print("no damage found.")


def _print_repair(report: RepairReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not report.threads:
        console.print("nothing to repair.")
        return
    table = Table("thread", "faults", "actions" if report.apply else "would do", "result")
    for t in report.threads:
        result = f"refused: {t.refused}" if t.refused else ("repaired" if t.applied else "dry run")
        table.add_row(t.thread_id, ", ".join(t.faults), "\n".join(t.actions), result)
    console.print(table)
    if not report.apply:
        console.print("dry run: nothing written. Run with --apply to repair.")
