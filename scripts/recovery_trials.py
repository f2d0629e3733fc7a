"""How long a whole-worker SIGKILL costs a conversation, on real servers and processes.

    nice -n 10 .venv/bin/python scripts/recovery_trials.py celery --trials 10
    nice -n 10 .venv/bin/python scripts/recovery_trials.py temporal --trials 10
    nice -n 10 .venv/bin/python scripts/recovery_trials.py loop --trials 10

Each trial is a fresh thread of the agent in tests/orchestrators/_agent.py. Turn 1 hangs
inside its refund (after the side effect, with the journal before its op returned); the
whole worker is SIGKILLed there (``celery worker`` with its pool, the Temporal worker
process, the job process) and a fresh one started at once. The user's next message
(turn 2) is sent right after the kill, and sent again whenever it failed for good (a
user retrying; ``loop`` and ``celery`` only: Temporal's workflow runs turn 2 after turn
1); ``--no-next-turn`` sends none, measuring the broker's redelivery alone. Measured from the kill: ``turn1`` until turn 1's run finished (its tool call answered
and the model's reply stored), ``turn2`` until turn 2 finished; a trial past
``--deadline`` counts as not recovered. Checked per trial: each user message once, no
unanswered tool call. Prints one line per trial and a JSON summary (median, max).

``--src DIR`` runs the workers on another checkout's ``src`` (the release before, for a
"before" figure); the settings flags default to the ones the pages recommend.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from tests.orchestrators import _agent  # noqa: E402
from tests.orchestrators.servers import RedisServer, TemporalDevServer  # noqa: E402

from devtools.postgres import (  # noqa: E402
    create_database,
    database_name,
    drop_database,
    ensure_database_url,
)
from langgraph_deterministic import DeterministicSaver  # noqa: E402


def q(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []


def wait_event(dsn: str, thread: str, what: str, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = q(dsn, "SELECT pid FROM trial_events WHERE thread_id = %s AND what = %s "
                 "ORDER BY seq LIMIT 1", thread, what)  # fmt: skip
        if rows:
            return int(rows[0][0])
        time.sleep(0.02)
    return None


class Watch:
    """Polls the thread: when turn 1 and turn 2 finished (seconds after ``t0``)."""

    def __init__(self, saver: DeterministicSaver, thread: str, t0: float) -> None:
        self.graph, self.thread, self.t0 = _agent.build(saver), thread, t0
        self.turn1: float | None = None
        self.turn2: float | None = None
        self.messages: list[Any] = []

    def poll(self) -> None:
        state = self.graph.get_state({"configurable": {"thread_id": self.thread}})
        msgs = self.messages = state.values.get("messages", [])
        now = round(time.monotonic() - self.t0, 2)
        humans = [i for i, m in enumerate(msgs) if m.type == "human"]
        # turn 1 finished: an AI reply without tool calls after its tool message
        if self.turn1 is None and any(
            m.type == "ai" and not m.tool_calls and any(p.type == "tool" for p in msgs[:i])
            and (len(humans) < 2 or i < humans[1])
            for i, m in enumerate(msgs)
        ):  # fmt: skip
            self.turn1 = now
        if (self.turn2 is None and len(humans) >= 2 and not state.next and msgs[-1].type == "ai"
                and not msgs[-1].tool_calls):  # fmt: skip
            self.turn2 = now

    def done(self) -> bool:
        return self.turn1 is not None and self.turn2 is not None


def permanent_failures(dsn: str, thread: str, run_id: str) -> int:
    rows = q(dsn, "SELECT count(*) FROM trial_outcomes WHERE thread_id = %s AND run_id = %s "
             "AND outcome NOT IN ('ok', 'Retry', 'ThreadBusyError', 'ConcurrentRunError')",
             thread, run_id)  # fmt: skip
    return int(rows[0][0])


def popen(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[Any]:
    out = open(log, "ab")  # noqa: SIM115 - the process writes to it until it ends
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                            start_new_session=True)  # fmt: skip


def kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the whole worker: main process and pool
    proc.wait()


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            kill_group(proc)


# --------------------------------------------------------------------------- rigs


class CeleryRig:
    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.args = args
        self.redis = RedisServer().start()
        self.env = {**env, "LGD_TRIAL_BROKER": self.redis.url,
                    "LGD_TRIAL_VISIBILITY": str(args.visibility),
                    "LGD_TRIAL_RESTORE_INTERVAL": str(args.restore_interval),
                    "LGD_TRIAL_RESTORE_THROTTLE": str(args.restore_throttle),
                    "LGD_TRIAL_MUTEX_EXPIRE": str(args.mutex_expire)}  # fmt: skip
        os.environ.update(self.env)
        from tests.orchestrators import _celery_app

        self.app = _celery_app.app
        self.worker = self.spawn()

    def spawn(self) -> subprocess.Popen[Any]:
        return popen(
            [sys.executable, "-m", "celery", "-A", "tests.orchestrators._celery_app", "worker",
             "--pool", "prefork", "--concurrency", "2", "--loglevel", "WARNING",
             "-n", f"w-{uuid.uuid4().hex[:6]}@%h", "--without-gossip", "--without-mingle",
             "--without-heartbeat"], self.env, self.args.logdir / "celery-worker.log",
        )  # fmt: skip

    def send(self, thread: str, text: str, task_id: str) -> None:
        self.app.send_task("tests.orchestrators._celery_app.chat_turn", args=[thread, text],
                           task_id=task_id)  # fmt: skip

    def start_turn1(self, thread: str) -> None:
        self.send(thread, "order-a", f"t1-{thread}")

    def kill_and_replace(self) -> None:
        kill_group(self.worker)
        self.worker = self.spawn()

    def next_turn(self, thread: str, n: int) -> str:
        run_id = f"t2-{thread}-{n}"
        self.send(thread, "order-b", run_id)
        return run_id

    def stop(self) -> None:
        stop(self.worker)
        self.redis.stop()


class LoopRig:
    """Job processes: turn 1's is killed; the next turn is a new job (a new run id)."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.mode = "call" if args.src else "invoke"
        self.procs: list[subprocess.Popen[Any]] = []
        self.turn1: subprocess.Popen[Any] | None = None

    def job(self, thread: str, run_id: str, text: str) -> subprocess.Popen[Any]:
        proc = popen([sys.executable, "-m", "tests.orchestrators._job", thread, run_id, text,
                      self.mode], self.env, self.args.logdir / "jobs.log")  # fmt: skip
        self.procs.append(proc)
        return proc

    def start_turn1(self, thread: str) -> None:
        self.turn1 = self.job(thread, f"t1-{thread}", "order-a")

    def kill_and_replace(self) -> None:
        assert self.turn1 is not None
        kill_group(self.turn1)  # the Job's pod; its restart is not counted on here

    def next_turn(self, thread: str, n: int) -> str:
        run_id = f"t2-{thread}-{n}"
        self.job(thread, run_id, "order-b")
        return run_id

    def stop(self) -> None:
        for p in self.procs:
            stop(p)


class TemporalRig:
    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.server = TemporalDevServer().start()
        self.queue = f"recovery-{uuid.uuid4().hex[:6]}"
        self.worker = self.spawn()
        self.loop = asyncio.new_event_loop()
        self.handle: Any = None

    def spawn(self) -> subprocess.Popen[Any]:
        return popen([sys.executable, "-m", "tests.orchestrators._temporal_worker",
                      self.server.address, self.queue], self.env,
                     self.args.logdir / "temporal-worker.log")  # fmt: skip

    def start_turn1(self, thread: str) -> None:
        from temporalio.client import Client

        async def go() -> Any:
            client = await Client.connect(self.server.address)
            return await client.start_workflow(
                "ChatWorkflow", args=[thread, ["order-a", "order-b"], 1, "chat_turn",
                                      self.args.heartbeat, self.args.initial_interval],
                id=f"wf-{thread}", task_queue=self.queue,
            )  # fmt: skip

        self.handle = self.loop.run_until_complete(go())

    def kill_and_replace(self) -> None:
        kill_group(self.worker)
        self.worker = self.spawn()

    def next_turn(self, thread: str, n: int) -> str | None:
        return None  # the workflow sends turn 2 itself, after turn 1

    def stop(self) -> None:
        stop(self.worker)
        self.loop.close()
        self.server.stop()


# --------------------------------------------------------------------------- main


def trial(rig: Any, dsn: str, saver: DeterministicSaver, n: int, args: argparse.Namespace) -> dict[str, Any]:
    thread = f"r{n}-{uuid.uuid4().hex[:6]}"
    q(dsn, "INSERT INTO trial_plan (thread_id, point, action) VALUES (%s, 'tool:inside', "
       "'hang')", thread)  # fmt: skip
    rig.start_turn1(thread)
    if wait_event(dsn, thread, "hang:tool:inside", 120) is None:
        return {"thread": thread, "note": "turn 1 never reached the refund"}
    rig.kill_and_replace()
    t0 = time.monotonic()
    q(dsn, "UPDATE trial_plan SET state = 'released' WHERE thread_id = %s", thread)
    watch = Watch(saver, thread, t0)
    sent = 0 if args.no_next_turn else 1
    current = None if args.no_next_turn else rig.next_turn(thread, sent)
    while time.monotonic() - t0 < args.deadline and not (
        watch.done() or (args.no_next_turn and watch.turn1 is not None)
    ):
        watch.poll()
        if current is not None and watch.turn2 is None and permanent_failures(dsn, thread, current):
            time.sleep(args.resend)  # the user sends the message again
            sent += 1
            current = rig.next_turn(thread, sent)
        time.sleep(0.1)
    watch.poll()
    humans = [str(m.content) for m in watch.messages if m.type == "human"]
    refused = q(dsn, "SELECT outcome, count(*) FROM trial_outcomes WHERE thread_id = %s AND "
                "run_id LIKE 't2-%%' AND outcome <> 'ok' GROUP BY outcome", thread)  # fmt: skip
    return {"thread": thread, "turn1": watch.turn1, "turn2": watch.turn2, "sends": sent,
            "next_turn_refusals": {str(o): int(c) for o, c in refused},
            "dup_inputs": len(humans) - len(set(humans)),
            "unanswered": len(_agent.unanswered(watch.messages))}  # fmt: skip


def stats(values: list[float | None], trials: int) -> dict[str, Any]:
    got = sorted(v for v in values if v is not None)
    return {"recovered": f"{len(got)}/{trials}",
            "median_s": round(statistics.median(got), 1) if got else None,
            "max_s": round(max(got), 1) if got else None}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("orchestrator", choices=["celery", "temporal", "loop"])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--deadline", type=float, default=120.0)
    parser.add_argument("--resend", type=float, default=2.0, help="seconds before a resend")
    parser.add_argument("--no-next-turn", action="store_true",
                        help="send no turn 2: measure the redelivery alone (celery, loop)")
    parser.add_argument("--src", default=None, help="run the workers on this src directory")
    parser.add_argument("--journal", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--visibility", type=float, default=300.0)
    parser.add_argument("--restore-interval", type=int, default=5)
    parser.add_argument("--restore-throttle", type=int, default=1)
    parser.add_argument("--mutex-expire", type=int, default=30)
    parser.add_argument("--heartbeat", type=float, default=10.0, help="Temporal heartbeat timeout")
    parser.add_argument("--initial-interval", type=float, default=1.0, help="Temporal retry")
    parser.add_argument("--logdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the trials' database")
    args = parser.parse_args()
    journal = args.journal if args.journal is not None else args.orchestrator != "loop"
    args.logdir = args.logdir or Path(f"/tmp/lgd-recovery-{args.orchestrator}-{os.getpid()}")
    args.logdir.mkdir(parents=True, exist_ok=True)
    admin, server = ensure_database_url()
    dsn = create_database(admin, prefix="lgd_recovery")
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    _agent.setup_tables(dsn)
    src = args.src or str(REPO / "src")
    env = {**os.environ, "LGD_TRIAL_DSN": dsn, "LGD_TRIAL_JOURNAL": "1" if journal else "0",
           "LGD_TRIAL_LEASE_TTL": str(args.lease_ttl), "PYTHONPATH": f"{REPO}:{src}"}  # fmt: skip
    os.environ.update({"LGD_TRIAL_DSN": dsn, "LGD_TRIAL_JOURNAL": env["LGD_TRIAL_JOURNAL"]})
    rigs = {"celery": CeleryRig, "temporal": TemporalRig, "loop": LoopRig}
    rig = rigs[args.orchestrator](args, env)
    results = []
    try:
        with DeterministicSaver(dsn) as saver:
            for n in range(args.trials):
                r = trial(rig, dsn, saver, n, args)
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        rig.stop()
        if not args.keep:
            drop_database(admin, database_name(dsn))
        if server is not None:
            server.stop()
    settings = {k: getattr(args, k) for k in ("lease_ttl", "deadline")}
    if args.orchestrator == "celery":
        settings |= {k: getattr(args, k) for k in
                     ("visibility", "restore_interval", "restore_throttle", "mutex_expire")}  # fmt: skip
    if args.orchestrator == "temporal":
        settings |= {"heartbeat": args.heartbeat, "initial_interval": args.initial_interval}
    summary = {
        "orchestrator": args.orchestrator, "src": args.src or "this checkout",
        "journal": journal, "settings": settings, "trials": len(results),
        "kill_to_turn1_finished": stats([r.get("turn1") for r in results], len(results)),
        "kill_to_next_turn_finished": stats([r.get("turn2") for r in results], len(results)),
        "next_turn_sends": sum(r.get("sends", 0) for r in results),
        "duplicated_inputs": sum(r.get("dup_inputs", 0) for r in results),
        "unanswered_tool_calls": sum(r.get("unanswered", 0) for r in results),
        "logs": str(args.logdir),
    }  # fmt: skip
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
