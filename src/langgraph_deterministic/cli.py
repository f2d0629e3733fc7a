"""``langgraph-deterministic``: apply migrations, show their status, run the demo.

    langgraph-deterministic migrate [--dsn DSN] [--phase pre|post|all]
    langgraph-deterministic status  [--dsn DSN]
    langgraph-deterministic demo    [--dsn DSN]
    langgraph-deterministic audit   [--dsn DSN] [--json] [--thread ID] [--since TIME]
    langgraph-deterministic repair  [--dsn DSN] [--apply]

audit exits 0 when it finds no damage, 1 when it does, 2 on usage or connection errors.

The DSN defaults to $DATABASE_URL.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from langgraph_deterministic.errors import DeterministicError


def _dsn(args: argparse.Namespace) -> str:
    dsn: str | None = args.dsn or os.environ.get("DATABASE_URL")
    if not dsn:
        raise SystemExit("error: pass --dsn or set DATABASE_URL")
    return dsn


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="langgraph-deterministic", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    migrate = sub.add_parser("migrate", help="create or upgrade the checkpoint tables")
    migrate.add_argument("--dsn")
    migrate.add_argument(
        "--phase",
        choices=["pre", "post", "all"],
        default="all",
        help="pre: safe while old workers run; post: after every worker is upgraded",
    )
    status = sub.add_parser("status", help="list applied and pending migrations")
    status.add_argument("--dsn")
    demo = sub.add_parser("demo", help="run the demo (embedded Postgres without --dsn)")
    demo.add_argument("--dsn")
    from langgraph_deterministic.ops import _cli as ops_cli

    ops_cli.add_parsers(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on a usage error, 0 for --help
        return int(exc.code or 0)
    if args.command in ("audit", "repair"):
        try:
            dsn = args.dsn or os.environ.get("DATABASE_URL")
            if not dsn:
                print("error: pass --dsn or set DATABASE_URL", file=sys.stderr)
                return 2
            if args.command == "audit":
                return ops_cli.run_audit(args, dsn)
            return ops_cli.run_repair(args, dsn)
        except DeterministicError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    try:
        if args.command == "demo":
            from langgraph_deterministic.demo import main as demo_main

            return int(demo_main(args.dsn or os.environ.get("DATABASE_URL")))
        from langgraph_deterministic.checkpointer import DeterministicSaver
        from langgraph_deterministic.checkpointer._migrate import discover

        with DeterministicSaver(_dsn(args), run_id_policy="off") as saver:
            if args.command == "migrate":
                applied = saver.setup(phase=args.phase)
                print("\n".join(f"applied {name}" for name in applied) or "up to date")
            else:
                done = saver.applied_migrations()
                for m in discover():
                    mark = "applied" if m.version in done else "pending"
                    print(f"{mark:8} {m.version:04d}_{m.phase}_{m.name}")
    except DeterministicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
