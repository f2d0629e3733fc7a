"""The ``audit``, ``repair``, ``prune`` and ``uninstall`` subcommands: argument parsing and output only."""

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

_LOCK_TIMEOUT = 0.2  # as _db.migrate's defaults (not imported: it is heavy)
_LOCK_RETRIES = 10

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


def _duration(text: str) -> timedelta:
    from langgraph_deterministic.errors import ConfigurationError
    from langgraph_deterministic.retention import parse_duration

    try:
        return parse_duration(text)
    except ConfigurationError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (30d, 12h, 90m, 2w)"
        ) from None


DSN_HELP = "libpq connection string of the checkpoint database (default: $DATABASE_URL)"


def add_parsers(sub: Any) -> None:
    a = sub.add_parser(
        "audit", help="find threads that retries damaged (read-only)",
        description="Scan the checkpoint tables for threads that retries damaged. Reads "
        "only; exit code 1 when damage is found.",
    )  # fmt: skip
    a.add_argument("--dsn", help=DSN_HELP)
    a.add_argument("--json", action="store_true", help="print a JSON report")
    a.add_argument("--thread", help="audit one thread only")
    a.add_argument("--since", type=_time, help="only threads written since TIME (ISO, or 6h, 2d)")
    a.add_argument(
        "--idle", type=_seconds, default=DEFAULT_IDLE, metavar="SECONDS",
        help=f"seconds a thread with a step left must be quiet to count as stuck, not running (default {int(DEFAULT_IDLE.total_seconds())})",
    )  # fmt: skip
    a.add_argument(
        "--statement-timeout", type=int, default=STATEMENT_TIMEOUT_MS, metavar="MS",
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
        "--priority", choices=("normal", "idle"), default="normal",
        help="normal (default): leave every process's scheduling as it is. idle (opt-in, "
        "Linux): run the audit's threads at SCHED_IDLE and, when the server runs on this "
        "machine and lets us, move its server backend there too (and into an lgd-idle cgroup "
        "where permitted), so live workers preempt the audit at once",
    )  # fmt: skip
    a.add_argument(
        "--messages-channel",
        default="messages",
        metavar="KEY",
        help="the state key that holds the conversation (default messages)",
    )
    r = sub.add_parser(
        "repair", help="fix what audit found (dry run unless --apply)",
        description="Plan (or with --apply write) a fix per thread audit reports as damaged; "
        "each thread is copied to a backup thread first.",
    )  # fmt: skip
    r.add_argument("--dsn", help=DSN_HELP)
    r.add_argument("--apply", action="store_true", help="write the repairs")
    r.add_argument("--json", action="store_true", help="print a JSON report")
    r.add_argument("--thread", help="repair one thread only")
    r.add_argument(
        "--idle", type=_seconds, default=DEFAULT_IDLE, metavar="SECONDS",
        help="seconds since a thread's last write before repair may touch it: a younger "
        f"thread may have a run in progress and is left alone (default {int(DEFAULT_IDLE.total_seconds())})",
    )  # fmt: skip
    r.add_argument(
        "--messages-channel",
        default="messages",
        metavar="KEY",
        help="the state key that holds the conversation (default messages)",
    )
    p = sub.add_parser(
        "prune", help="sweep threads past their TTL (dry run unless --apply)",
        description="Find the threads whose last write is older than --older-than (or their "
        "own metadata[\"retention_ttl_minutes\"]) and, with --apply, delete them whole "
        "(--strategy delete) or down to their latest checkpoint (keep_latest). Each thread is "
        "one transaction; threads with a live lease, a queued run, a write since the scan or "
        "an interrupt awaiting its resume are skipped and reported. Swept runs leave "
        "tombstones, so a late retry of one is refused instead of applied again. A dry run "
        "works on a database only PostgresSaver wrote; --apply needs `migrate` first.",
    )  # fmt: skip
    p.add_argument("--dsn", help=DSN_HELP)
    p.add_argument(
        "--older-than", type=_duration, metavar="DURATION",
        help="default TTL: threads last written longer ago than this expire (30d, 12h, 90m, "
        "2w); without it only threads with their own metadata[\"retention_ttl_minutes\"] expire",
    )  # fmt: skip
    p.add_argument(
        "--strategy", choices=("delete", "keep_latest"), default="delete",
        help="delete (default): the whole thread; keep_latest: the thread and its latest "
        "checkpoint stay, its history goes",
    )  # fmt: skip
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_true", help="report what would be swept (the default)"
    )
    mode.add_argument("--apply", action="store_true", help="sweep the expired threads")
    p.add_argument(
        "--expire-interrupted", action="store_true",
        help="threads stopped at an interrupt expire too (default: kept until resumed)",
    )  # fmt: skip
    p.add_argument(
        "--tombstone-ttl", type=_duration, default=None, metavar="DURATION",
        help="how long a swept run's tombstone refuses its retries (default 400d; keep it "
        "longer than any retry window of your orchestrator)",
    )  # fmt: skip
    p.add_argument(
        "--batch-size", type=int, default=500, metavar="N",
        help="threads read per scan statement (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--throttle", type=_pause, default=0.0, metavar="SECONDS",
        help="pause after each swept thread (default 0: full speed)",
    )  # fmt: skip
    p.add_argument(
        "--lock-timeout", type=float, default=_LOCK_TIMEOUT, metavar="SECONDS",
        help="longest wait for a thread's lease row; a thread not granted it is skipped "
        "and left for the next sweep (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--limit", type=int, default=None, metavar="N",
        help="sweep at most N threads, then stop (default: every expired thread)",
    )  # fmt: skip
    p.add_argument(
        "--every", type=_duration, default=None, metavar="DURATION",
        help="keep running: sweep now and again every DURATION (Platform's "
        "sweep_interval_minutes) until stopped; default: sweep once and exit (for cron)",
    )  # fmt: skip
    p.add_argument(
        "--sweeps", type=int, default=None, metavar="N",
        help="with --every: stop after N sweeps (default: run until stopped)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print a JSON report")
    u = sub.add_parser(
        "uninstall", help="remove every table, function and index of ours (back to PostgresSaver)",
        description="Remove every object our migrations added (lgd_* tables, functions, "
        "sequences, types, the run id index on checkpoints, our migrations' bookkeeping, "
        "our lz4 setting on the peer's columns). PostgresSaver's tables and rows stay as "
        "it needs them. Online: short lock timeouts, retried.",
    )  # fmt: skip
    u.add_argument("--dsn", help=DSN_HELP)
    u.add_argument(
        "--dry-run", action="store_true", help="print the exact statements; change nothing"
    )
    u.add_argument(
        "--force", action="store_true",
        help="remove even while runs of ours hold live thread leases (their workers then "
        "fail on their next write)",
    )  # fmt: skip
    u.add_argument(
        "--lock-timeout", type=float, default=_LOCK_TIMEOUT, metavar="SECONDS",
        help="longest wait for a table lock per attempt (default %(default)s)",
    )  # fmt: skip
    u.add_argument(
        "--lock-retries", type=int, default=_LOCK_RETRIES, metavar="N",
        help="attempts after the first when a lock is not granted (default %(default)s)",
    )  # fmt: skip


def run_audit(args: argparse.Namespace, dsn: str) -> int:
    from langgraph_deterministic.ops.audit import audit

    progress, done = _progress("auditing checkpoints", enabled=not args.json)
    try:
        report = audit(
            dsn, thread_id=args.thread, since=args.since, idle=args.idle,
            statement_timeout_ms=args.statement_timeout, progress=progress, pause=args.pause,
            duty=args.duty, priority=args.priority, messages_channel=args.messages_channel,
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

    report = repair(
        dsn, apply=args.apply, thread_id=args.thread, idle=args.idle,
        messages_channel=args.messages_channel,
    )  # fmt: skip
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_repair(report)
    return report.exit_code


def run_prune(args: argparse.Namespace, dsn: str) -> int:
    import time

    from langgraph_deterministic.checkpointer import DeterministicSaver
    from langgraph_deterministic.retention import (
        DEFAULT_TOMBSTONE_TTL,
        RetentionPolicy,
        SweepReport,
    )

    policy = RetentionPolicy(
        default_ttl=args.older_than, strategy=args.strategy,
        expire_interrupted=args.expire_interrupted,
        tombstone_ttl=args.tombstone_ttl or DEFAULT_TOMBSTONE_TTL,
        batch_size=args.batch_size, throttle=args.throttle, lock_timeout=args.lock_timeout,
        limit=args.limit,
    )  # fmt: skip
    if policy.default_ttl is None:
        print(
            "no --older-than: only threads with their own metadata[\"retention_ttl_minutes\"] expire",
            file=sys.stderr,
        )
    sweeps = 0
    with DeterministicSaver(dsn, run_id_policy="off") as saver:
        while True:
            bar, done = _progress("sweeping threads", enabled=not args.json)
            try:
                report: SweepReport = saver.sweep(
                    policy, apply=args.apply, progress=_swept_progress(bar),
                )  # fmt: skip
            finally:
                done()
            if args.json:
                print(json.dumps(report.to_json(), indent=2), flush=True)
            else:
                _print_prune(report)
            sweeps += 1
            if args.every is None or (args.sweeps is not None and sweeps >= args.sweeps):
                return 0
            time.sleep(args.every.total_seconds())


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    size = n / 1024
    for unit in ("kB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _swept_progress(bar: Any) -> Any:
    if bar is None:
        return None
    return lambda scanned, _swept, _thread: bar(scanned, None)


def _print_prune(report: object) -> None:
    from langgraph_deterministic.retention import SKIP_REASONS, SweepReport

    assert isinstance(report, SweepReport)
    verb = "swept" if report.applied else "would sweep"
    print(
        f"scanned {report.threads_label()} in {report.seconds:.1f} s: {len(report.expired)} "
        f"past their TTL; {verb} {len(report.swept)} ({report.strategy})",
        flush=True,
    )
    for reason, threads in sorted(report.skipped.items()):
        shown = ", ".join(threads[:10]) + (" ..." if len(threads) > 10 else "")
        print(f"  skipped {len(threads)}: {SKIP_REASONS[reason]}: {shown}")
    if report.applied:
        print(
            f"freed {report.rows_freed} rows, {_size(report.bytes_freed)} of row data "
            f"(the space is reused by new rows; VACUUM/pg_repack returns it to the OS); "
            f"{report.tombstones_expired} expired tombstones removed"
        )
    else:
        if report.swept:
            shown = ", ".join(report.swept[:10]) + (" ..." if len(report.swept) > 10 else "")
            print(f"  would sweep: {shown}")
        note = "" if report.ours else " (a PostgresSaver database: --apply needs `migrate` first)"
        print(f"dry run: nothing deleted. Run with --apply to sweep.{note}")


def run_uninstall(args: argparse.Namespace, dsn: str) -> int:
    from langgraph_deterministic.ops.uninstall import Step, uninstall

    def show(step: Step, attempts: int, seconds: float) -> None:
        tries = f", {attempts} attempts" if attempts > 1 else ""
        print(f"removed {step.what}: {seconds:.2f} s{tries}", flush=True)

    report = uninstall(
        dsn, dry_run=args.dry_run, force=args.force, lock_timeout=args.lock_timeout,
        lock_retries=args.lock_retries, progress=show,
    )  # fmt: skip
    if args.dry_run:
        for step in report.steps:
            print(f"-- {step.what}\n{step.sql};\n")
        if report.live_leases:
            print(
                f"-- refused when run now: {len(report.live_leases)} thread(s) are leased by "
                "runs of ours in progress (stop their workers, or pass --force)"
            )
        print(
            f"-- {len(report.steps)} statement(s) would run; nothing changed"
            if report.steps
            else "-- nothing of ours in this database: nothing to remove"
        )
    elif report.steps:
        print(
            f"removed in {report.seconds:.2f} s; PostgresSaver's tables and rows are as "
            "they were (run `langgraph-deterministic migrate` to come back)"
        )
    else:
        print("nothing of ours in this database: nothing removed")
    return 0


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
        f"{report.seconds:.1f} s"
        + (
            f" ({report.active_threads} with a run in progress: written within --idle, so "
            "not judged stuck, and repair leaves them until they are idle)"
            if report.active_threads
            else ""
        )
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
        busy = sorted(t for t in damaged if t in report.heads and report.heads[t].in_progress)
        if busy:
            console.print(
                f"{len(busy)} of these may have a run in progress (written within --idle): "
                "repair leaves them until they are idle (if their workers are dead, "
                "`repair --idle 0` repairs them now): "
                + ", ".join(busy[:20])
                + (" ..." if len(busy) > 20 else "")
            )
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


def check_dsn(dsn: str, given_as: str) -> None:
    """The top-level CLI's check of a DSN before any subcommand runs (``_connect.check``:
    a failed login, a missing database or an unreachable server, said as such)."""
    from langgraph_deterministic.ops import _connect

    _connect.check(dsn, given_as)
