"""``langgraph-deterministic``: migrations and their status, the demo, audit, repair, prune.

    langgraph-deterministic migrate [--dsn DSN] [--phase pre|post|all] [--dry-run]
                                    [--lock-timeout SECONDS] [--lock-retries N]
    langgraph-deterministic status  [--dsn DSN]
    langgraph-deterministic demo    [--dsn DSN] [--restate]
    langgraph-deterministic audit   [--dsn DSN] [--json] [--thread ID] [--since TIME]
    langgraph-deterministic repair  [--dsn DSN] [--apply]
    langgraph-deterministic prune   [--dsn DSN] --older-than 30d [--strategy delete|keep_latest]
                                    [--dry-run|--apply] [--every DURATION]
    langgraph-deterministic uninstall [--dsn DSN] [--dry-run] [--force]
    langgraph-deterministic --version

The DSN defaults to $DATABASE_URL. Exit codes: 0 success, 1 the command failed (e.g. a
migration could not get its lock; for audit: damage found; for repair: something to
repair, or a thread refused), 2 usage or connection error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import psycopg

from langgraph_deterministic._db.translate import translate_error
from langgraph_deterministic._dsn import scrub
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _dsn(args: argparse.Namespace) -> str:
    """The DSN the user gave, checked once: a failed login, a missing database or an
    unreachable server is reported as such, for --dsn or $DATABASE_URL, whichever it was."""
    from langgraph_deterministic.ops.cli import check_dsn

    dsn: str | None = args.dsn or os.environ.get("DATABASE_URL")
    if not dsn:
        raise ConfigurationError(
            f"{args.command} needs a database. Fix: pass --dsn postgresql://user:password@"
            "host:5432/dbname, or set DATABASE_URL."
        )
    check_dsn(dsn, "--dsn" if args.dsn else "$DATABASE_URL")
    return dsn


DSN_HELP = "libpq connection string of the database (default: $DATABASE_URL)"


# --- migrate / status -------------------------------------------------------------


def _add_migrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from langgraph_deterministic._db import migrate as _migrate

    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade the checkpoint tables",
        description="Apply pending migrations, beside live workers: each statement waits "
        "at most --lock-timeout for its lock and retries with backoff.",
    )
    migrate.add_argument("--dsn", help=DSN_HELP)
    migrate.add_argument(
        "--phase",
        choices=["pre", "post", "all"],
        default="all",
        help="pre: safe while old workers run; post: after every worker is upgraded",
    )
    migrate.add_argument(
        "--dry-run", action="store_true", help="print the SQL that would run; change nothing"
    )
    migrate.add_argument(
        "--lock-timeout",
        type=float,
        default=_migrate.DEFAULT_LOCK_TIMEOUT,
        metavar="SECONDS",
        help="longest wait for a table lock per attempt (default %(default)s)",
    )
    migrate.add_argument(
        "--lock-retries",
        type=int,
        default=_migrate.DEFAULT_LOCK_RETRIES,
        metavar="N",
        help="attempts after the first when a lock is not granted (default %(default)s)",
    )


def _cmd_migrate(args: argparse.Namespace) -> int:
    from langgraph_deterministic._db.migrate import StepReport, label
    from langgraph_deterministic.checkpointer import DeterministicSaver

    def show(step: StepReport) -> None:
        name = label(step.migration)
        if args.dry_run:
            note = f" ({step.reason})" if step.reason else ""
            if step.action == "would skip":
                print(f"-- {name}: skipped{note}: {' '.join(step.sql.split())[:100]}")
            else:
                print(f"-- {name} [{step.migration.phase}]{note}\n{step.sql.rstrip(';')};\n")
            return
        code = [
            ln for ln in step.sql.splitlines() if ln.strip() and not ln.lstrip().startswith("--")
        ]
        what = " ".join(" ".join(code).split())[:70]
        if step.action == "skipped":
            print(f"{name}: skipped ({step.reason}): {what}", flush=True)
        else:
            tries = f", {step.attempts} attempts" if step.attempts > 1 else ""
            print(f"{name}: {step.seconds:.2f} s{tries}: {what}", flush=True)

    t0 = time.perf_counter()
    with DeterministicSaver(_dsn(args), run_id_policy="off") as saver:
        names = saver.setup(
            phase=args.phase,
            dry_run=args.dry_run,
            lock_timeout=args.lock_timeout,
            lock_retries=args.lock_retries,
            progress=show,
        )
    elapsed = time.perf_counter() - t0
    if args.dry_run:
        print(
            f"-- {len(names)} migration(s) would be applied"
            + (f": {', '.join(names)}" if names else "")
        )
    elif names:
        print(f"applied {len(names)} migration(s) in {elapsed:.2f} s: {', '.join(names)}")
    else:
        print("up to date")
    return EXIT_OK


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="list applied and pending migrations")
    status.add_argument("--dsn", help=DSN_HELP)


def _cmd_status(args: argparse.Namespace) -> int:
    from langgraph_deterministic._db.migrate import discover, label
    from langgraph_deterministic.checkpointer import DeterministicSaver

    with DeterministicSaver(_dsn(args), run_id_policy="off") as saver:
        done = saver.applied_migrations()
    pending = 0
    for m in discover():
        mark = "applied" if m.version in done else "pending"
        pending += m.version not in done
        print(f"{mark:8} {label(m)}")
    print(f"{pending} pending" if pending else "up to date")
    return EXIT_OK


# --- demo ---------------------------------------------------------------------------


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run the demo (embedded Postgres without --dsn)")
    demo.add_argument(
        "--dsn",
        help="a Postgres server to run the demo on, in a scratch database it creates and "
        "drops (the role needs CREATEDB; default: $DATABASE_URL, else an embedded server)",
    )
    demo.add_argument(
        "--restate",
        action="store_true",
        help="instead: parallel nodes on a real restate-server with forced replay, plain "
        "LangGraph beside DeterministicRunner (restate-server from $RESTATE_SERVER, PATH "
        "or .cache/restate-server; the restate extra)",
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.restate:
        from langgraph_deterministic.demos.parallel_restate import run_restate_demo

        return run_restate_demo()
    from langgraph_deterministic.demos.support_agent import main as demo_main

    given = args.dsn or os.environ.get("DATABASE_URL")
    return int(demo_main(_dsn(args) if given else None))


# --- audit / repair (langgraph_deterministic.ops) -----------------------------------


def _cmd_ops(args: argparse.Namespace) -> int:
    """audit/repair keep exit code 1 for "damage found", so every error is 2 here: one of
    ours, and any other exception too (a traceback's exit 1 would read as damage)."""
    from langgraph_deterministic.ops import cli as ops_cli

    try:
        run = ops_cli.run_audit if args.command == "audit" else ops_cli.run_repair
        return run(args, _dsn(args))
    except DeterministicError as exc:
        _error(args, str(exc))
        return EXIT_USAGE
    except psycopg.Error as exc:  # one the command did not expect (a missing grant)
        translated = translate_error(exc)
        if translated is exc:
            _error(args, f"the {args.command} failed in Postgres: {exc}; it wrote nothing it "
                   "had not finished.")  # fmt: skip
        else:
            _error(args, str(translated))
        return EXIT_USAGE
    except Exception as exc:  # not ours: a bug; still exit 2, never the "damage found" 1
        _error(
            args,
            f"the {args.command} itself failed ({type(exc).__name__}: {exc}); it wrote "
            "nothing it had not finished. Please report this.",
        )
        return EXIT_USAGE


def _error(args: argparse.Namespace, text: str) -> None:
    """An error line on stderr, with any password of the command's DSN masked (the
    messages are built redacted; this is the last guard)."""
    dsn = getattr(args, "dsn", None) or os.environ.get("DATABASE_URL")
    print(f"error: {scrub(text, dsn)}", file=sys.stderr)


def _cmd_prune(args: argparse.Namespace) -> int:
    from langgraph_deterministic.ops import cli as ops_cli

    return ops_cli.run_prune(args, _dsn(args))


def _cmd_uninstall(args: argparse.Namespace) -> int:
    from langgraph_deterministic.ops import cli as ops_cli

    return ops_cli.run_uninstall(args, _dsn(args))


_COMMANDS = {
    "migrate": _cmd_migrate,
    "status": _cmd_status,
    "demo": _cmd_demo,
    "audit": _cmd_ops,
    "repair": _cmd_ops,
    "prune": _cmd_prune,
    "uninstall": _cmd_uninstall,
}


def _version() -> str:
    """This package's version, and LangGraph's and Python's beside it (for bug reports)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    python = ".".join(map(str, sys.version_info[:3]))
    return f"langgraph-deterministic {of('langgraph-deterministic')} (langgraph {of('langgraph')}, Python {python})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="langgraph-deterministic",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    _add_migrate(sub)
    _add_status(sub)
    _add_demo(sub)
    from langgraph_deterministic.ops import cli as ops_cli

    ops_cli.add_parsers(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        try:
            return _COMMANDS[args.command](args)
        except psycopg.Error as exc:  # one the command did not expect (a missing grant)
            translated = translate_error(exc)
            if translated is exc:
                raise
            raise translated from exc
    except (DatabaseUnavailableError, ConfigurationError) as exc:
        _error(args, str(exc))
        return EXIT_USAGE
    except DeterministicError as exc:
        _error(args, str(exc))
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
