"""Trials of the Temporal and Celery glue on real servers, with real worker processes.

    nice -n 10 .venv/bin/python scripts/orchestrator_trials.py temporal --kills 20 --zombies 10
    nice -n 10 .venv/bin/python scripts/orchestrator_trials.py celery --kills 20 --zombies 5 \\
        --duplicates 5 --journal

Each trial is a fresh thread of the agent in tests/orchestrators/_agent.py (a strict model
that raises like a provider's 400 on an unanswered tool call; a refund tool whose side
effect is recorded), run as two turns:

* ``kill``: the worker process running turn 1 is SIGKILLed at a random point: hung at one
  of ``model``, ``tool:before``, ``tool:inside`` (after the side effect, before its op
  returned), ``tool:after`` (the op returned, its result journaled), ``model2`` (right
  after the tool step's checkpoint), or at a random moment after the turn started;
* ``zombie``: that worker is frozen (SIGSTOP) past the heartbeat / visibility timeout, the
  orchestrator retries the turn elsewhere, and the zombie is thawed (SIGCONT) at a random
  moment after the retry started;
* ``duplicate`` (Celery): one message published twice with one task id, at once;
* ``transient``: a ``TimeoutError`` raised once inside the refund op, after its side
  effect.

Then turn 2 must run on the thread. Checked per trial: each user message once in the
thread (duplicated inputs), every tool call answered, both turns finished within the
deadline (stuck threads), with the journal no side effect executed again after its op
had returned, no psycopg exception surfacing from any attempt. Prints one line per trial
and a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from tests.orchestrators import _agent  # noqa: E402
from tests.orchestrators.servers import RedisServer, TemporalDevServer  # noqa: E402

from devtools.postgres import create_database, ensure_database_url  # noqa: E402
from langgraph_deterministic import DeterministicSaver  # noqa: E402

POINTS = ["model", "tool:before", "tool:inside", "tool:after", "model2", "random"]
ZOMBIE_POINTS = ["model", "tool:before", "tool:inside", "tool:after", "model2"]


@dataclass
class Trial:
    kind: str
    point: str
    thread_id: str
    ok: bool = False
    finished: bool = False
    dup_inputs: int = 0
    unanswered: int = 0
    reexecuted: int = 0
    effects: int = 0
    psycopg_errors: int = 0
    outcomes: list[str] = field(default_factory=list)
    zombie: str = ""
    winners: int = 0  # processes that got past turn 1's tool step (continued its checkpoint)
    note: str = ""
    seconds: float = 0.0


def q(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []


def wait_event(dsn: str, thread: str, what: str, timeout: float) -> tuple[int, int] | None:
    """(pid, seq) of the first ``what`` event on ``thread``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = q(dsn, "SELECT pid, seq FROM trial_events WHERE thread_id = %s AND what = %s "
                 "ORDER BY seq LIMIT 1", thread, what)  # fmt: skip
        if rows:
            return int(rows[0][0]), int(rows[0][1])
        time.sleep(0.02)
    return None


def wait_other_pid(dsn: str, thread: str, pid: int, after: int, timeout: float) -> bool:
    """Wait until a process other than ``pid`` records an event (the retry started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if q(dsn, "SELECT 1 FROM trial_events WHERE thread_id = %s AND pid <> %s AND seq > %s",
             thread, pid, after):  # fmt: skip
            return True
        time.sleep(0.05)
    return False


def check(
    dsn: str, saver: DeterministicSaver, trial: Trial, texts: list[str], journal: bool
) -> None:
    """The thread's invariants after the trial's turns."""
    graph = _agent.build(saver)
    state = graph.get_state({"configurable": {"thread_id": trial.thread_id}})
    messages = state.values.get("messages", [])
    humans = [str(m.content) for m in messages if m.type == "human"]
    trial.dup_inputs = sum(c - 1 for c in collections.Counter(humans).values() if c > 1)
    trial.unanswered = len(_agent.unanswered(messages))
    events = q(dsn, "SELECT what, detail, pid FROM trial_events WHERE thread_id = %s "
               "ORDER BY seq", trial.thread_id)  # fmt: skip
    # An execution of the side effect starts at its op's "tool:before" (same process);
    # one that started after the op had returned (its result journaled) re-executed a
    # finished side effect. One already running when the op returned elsewhere (a zombie
    # thawed inside it) is the at-least-once window, with the same idempotency key.
    returned: set[str] = set()
    started: dict[tuple[int, str], bool] = {}
    winners: set[int] = set()
    for what, detail, pid in events:
        call = (detail or "").split(" ")[0]
        if what == "tool:after":
            returned.add(call)
        elif what == "tool:before":
            started[(pid, call)] = call in returned
        elif what == "model2" and call == "call-1":
            winners.add(pid)
        elif what == "effect":
            trial.effects += 1
            if started.get((pid, call), call in returned):
                trial.reexecuted += 1
    trial.winners = len(winners)
    outs = q(dsn, "SELECT outcome, module, pid FROM trial_outcomes WHERE thread_id = %s "
             "ORDER BY seq", trial.thread_id)  # fmt: skip
    trial.outcomes = [o for o, _, _ in outs]
    trial.psycopg_errors = sum(1 for _, m, _ in outs if m and m.startswith("psycopg"))
    finished_ok = humans == texts and not state.next and messages and messages[-1].type == "ai"
    trial.ok = bool(
        trial.finished and finished_ok and not trial.dup_inputs and not trial.unanswered
        and not trial.psycopg_errors and not (journal and trial.reexecuted)
    )  # without the journal a tool step that had not returned runs again: counted, not bad
    if not finished_ok and not trial.note:
        trial.note = f"humans={humans} next={state.next}"


def zombie_outcome(dsn: str, thread: str, pid: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = q(dsn, "SELECT outcome FROM trial_outcomes WHERE thread_id = %s AND pid = %s "
                 "ORDER BY seq", thread, pid)  # fmt: skip
        if rows:
            return str(rows[0][0])  # the frozen attempt's own end (later rows: later turns)
        time.sleep(0.1)
    return "no outcome yet"


# --------------------------------------------------------------------------- Temporal


class _Address:
    """A server somebody else runs (``--temporal`` / ``--redis``): not ours to stop."""

    def __init__(self, address: str) -> None:
        self.address = self.url = address

    def stop(self) -> None:
        pass


class TemporalRig:
    def __init__(self, args: argparse.Namespace, dsn: str, env: dict[str, str]) -> None:
        self.args, self.dsn, self.env = args, dsn, env
        self.server: Any = (
            _Address(args.temporal) if args.temporal else TemporalDevServer().start()
        )
        self.queue = f"trials-{uuid.uuid4().hex[:6]}"
        self.workers: list[subprocess.Popen[Any]] = []
        for _ in range(args.workers):
            self.spawn()

    def spawn(self) -> None:
        log = open(self.args.logdir / f"temporal-worker-{len(self.workers)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.orchestrators._temporal_worker", self.server.address,
             self.queue], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        self.workers.append(proc)

    def replace_dead(self) -> None:
        alive = [w for w in self.workers if w.poll() is None]
        missing = self.args.workers - len(alive)
        self.workers = alive
        for _ in range(missing):
            self.spawn()

    def stop(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                os.kill(w.pid, signal.SIGCONT)
                w.terminate()
        for w in self.workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
        self.server.stop()

    def run_trial(self, trial: Trial, texts: list[str]) -> None:
        asyncio.run(self._trial(trial, texts))

    async def _trial(self, trial: Trial, texts: list[str]) -> None:
        from temporalio.client import Client

        client = await Client.connect(self.server.address)
        activity = "chat_turn_sync" if self.args.sync else "chat_turn"
        handle = await client.start_workflow(
            "ChatWorkflow", args=[trial.thread_id, texts, 1, activity, self.args.heartbeat],
            id=f"wf-{trial.thread_id}", task_queue=self.queue,
        )  # fmt: skip
        result = asyncio.ensure_future(handle.result())
        await asyncio.to_thread(self.disrupt, trial)
        try:
            await asyncio.wait_for(result, self.args.deadline)
            trial.finished = True
        except Exception as exc:
            trial.note = f"workflow: {type(exc).__name__}: {exc}"[:300]
            with_cause = getattr(exc, "cause", None)
            if with_cause is not None:
                trial.note += f" <- {with_cause}"[:200]
        self.replace_dead()

    def disrupt(self, trial: Trial) -> None:
        disrupt(self.dsn, trial, self.args, zombie_wait=self.args.heartbeat)


def disrupt(dsn: str, trial: Trial, args: argparse.Namespace, zombie_wait: float) -> None:
    """Kill, freeze or fail the process running turn 1 as the trial says."""
    if trial.kind in ("transient", "duplicate") or trial.kind == "none":
        return
    if trial.point == "random":
        first = wait_event(dsn, trial.thread_id, "model", 60)
        if first is None:
            trial.note = "turn 1 never started"
            return
        time.sleep(random.uniform(0, 0.4))
        pid = int(q(dsn, "SELECT pid FROM trial_events WHERE thread_id = %s ORDER BY seq DESC "
                    "LIMIT 1", trial.thread_id)[0][0])  # fmt: skip
        os.kill(pid, signal.SIGKILL)
        return
    hung = wait_event(dsn, trial.thread_id, f"hang:{trial.point}", 60)
    if hung is None:
        trial.note = f"never reached {trial.point}"
        return
    pid, seq = hung
    if trial.kind == "kill":
        os.kill(pid, signal.SIGKILL)
        return
    os.kill(pid, signal.SIGSTOP)  # a zombie: frozen past the heartbeat / visibility timeout
    try:
        retried = wait_other_pid(dsn, trial.thread_id, pid, seq, zombie_wait * 4 + 30)
        if not retried:
            trial.zombie = "never retried while frozen"
        time.sleep(random.uniform(0, 1.5))  # thaw at a random moment of the retry
    finally:
        q(dsn, "UPDATE trial_plan SET state = 'released' WHERE thread_id = %s",
          trial.thread_id)  # fmt: skip
        os.kill(pid, signal.SIGCONT)
    trial.zombie = zombie_outcome(dsn, trial.thread_id, pid, 20) + (
        "" if not trial.zombie else f" ({trial.zombie})"
    )


# --------------------------------------------------------------------------- Celery


class CeleryRig:
    def __init__(self, args: argparse.Namespace, dsn: str, env: dict[str, str]) -> None:
        self.args, self.dsn = args, dsn
        self.redis: Any = _Address(args.redis) if args.redis else RedisServer().start()
        self.env = {**env, "LGD_TRIAL_BROKER": self.redis.url,
                    "LGD_TRIAL_VISIBILITY": str(args.visibility)}  # fmt: skip
        os.environ.update(self.env)
        from tests.orchestrators import _celery_app

        self.app = _celery_app.app
        self.workers: list[subprocess.Popen[Any]] = []
        for n in range(args.workers):
            log = open(args.logdir / f"celery-worker-{n}.log", "wb")  # noqa: SIM115
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.orchestrators._celery_app",
                 "worker", "--pool", "prefork", "--concurrency", "2", "--loglevel", "WARNING",
                 "-n", f"w{n}-{uuid.uuid4().hex[:4]}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            ))  # fmt: skip

    def stop(self) -> None:
        for w in self.workers:
            w.send_signal(signal.SIGQUIT)  # cold shutdown: no waiting for retries due later
        for w in self.workers:
            try:
                w.wait(15)
            except subprocess.TimeoutExpired:
                w.kill()
        self.redis.stop()

    def send(self, thread: str, text: str, task_id: str) -> None:
        self.app.send_task("tests.orchestrators._celery_app.chat_turn", args=[thread, text],
                           task_id=task_id)  # fmt: skip

    def wait_turn(self, thread: str, humans: int, timeout: float) -> bool:
        """Until the thread holds ``humans`` user messages and ends with an answer."""
        deadline = time.monotonic() + timeout
        graph = _agent.build(self.saver)
        while time.monotonic() < deadline:
            state = graph.get_state({"configurable": {"thread_id": thread}})
            msgs = state.values.get("messages", [])
            n = sum(m.type == "human" for m in msgs)
            if n >= humans and not state.next and msgs and msgs[-1].type == "ai" and \
                    not msgs[-1].tool_calls:  # fmt: skip
                return True
            time.sleep(0.1)
        return False

    def run_trial(self, trial: Trial, texts: list[str]) -> None:
        task_id = str(uuid.uuid4())
        if trial.kind == "duplicate":
            self.send(trial.thread_id, texts[0], task_id)
            self.send(trial.thread_id, texts[0], task_id)  # the same message, twice at once
        else:
            self.send(trial.thread_id, texts[0], task_id)
        disrupt(self.dsn, trial, self.args, zombie_wait=self.args.visibility)
        if not self.wait_turn(trial.thread_id, 1, self.args.deadline):
            trial.note = trial.note or "turn 1 never finished"
            return
        self.send(trial.thread_id, texts[1], str(uuid.uuid4()))
        trial.finished = self.wait_turn(trial.thread_id, 2, self.args.deadline)
        if not trial.finished:
            trial.note = trial.note or "turn 2 never finished"


# --------------------------------------------------------------------------- main


def plan(dsn: str, trial: Trial) -> None:
    if trial.kind == "transient":
        q(dsn, "INSERT INTO trial_plan (thread_id, point, action) VALUES (%s, %s, 'raise')",
          trial.thread_id, "tool:inside")  # fmt: skip
    elif trial.kind in ("kill", "zombie") and trial.point != "random":
        q(dsn, "INSERT INTO trial_plan (thread_id, point, action) VALUES (%s, %s, 'hang')",
          trial.thread_id, trial.point)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("orchestrator", choices=["temporal", "celery"])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--zombies", type=int, default=10)
    parser.add_argument("--duplicates", type=int, default=0)
    parser.add_argument("--transient", type=int, default=2)
    parser.add_argument("--journal", action="store_true")
    parser.add_argument("--sync", action="store_true", help="Temporal: the sync activity")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--heartbeat", type=float, default=2.0, help="Temporal heartbeat timeout")
    parser.add_argument("--visibility", type=float, default=4.0, help="redis visibility timeout")
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--logdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="print the DSN at the end")
    parser.add_argument("--point", choices=POINTS, default=None, help="kill here only")
    parser.add_argument("--dsn", default=None, help="an empty database to use")
    parser.add_argument("--temporal", default=None, help="a running Temporal server")
    parser.add_argument("--redis", default=None, help="a running redis-server (URL)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    args.logdir = args.logdir or Path(f"/tmp/lgd-trials-{args.orchestrator}-{seed}")
    args.logdir.mkdir(parents=True, exist_ok=True)

    admin, server = (args.dsn, None) if args.dsn else ensure_database_url()
    dsn = args.dsn or create_database(admin, prefix="lgd_trials")
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    _agent.setup_tables(dsn)
    env = {**os.environ, "LGD_TRIAL_DSN": dsn, "LGD_TRIAL_JOURNAL": "1" if args.journal else "0",
           "LGD_TRIAL_LEASE_TTL": str(max(args.heartbeat, 2.0)),
           "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}  # fmt: skip
    os.environ.update({"LGD_TRIAL_DSN": dsn, "LGD_TRIAL_JOURNAL": env["LGD_TRIAL_JOURNAL"]})
    kinds = (["kill"] * args.kills + ["zombie"] * args.zombies
             + ["duplicate"] * args.duplicates + ["transient"] * args.transient)  # fmt: skip
    random.shuffle(kinds)
    rig: Any = TemporalRig(args, dsn, env) if args.orchestrator == "temporal" else None
    if rig is None:
        rig = CeleryRig(args, dsn, env)
    trials: list[Trial] = []
    try:
        with DeterministicSaver(dsn) as saver:
            rig.saver = saver
            for n, kind in enumerate(kinds):
                point = {"kill": args.point or random.choice(POINTS), "zombie": random.choice(ZOMBIE_POINTS)}.get(
                    kind, "tool:inside" if kind == "transient" else "-"
                )
                trial = Trial(kind, point, f"t{n}-{uuid.uuid4().hex[:6]}")
                texts = [f"order-{n}-a", f"order-{n}-b"]
                plan(dsn, trial)
                start = time.monotonic()
                rig.run_trial(trial, texts)
                trial.seconds = round(time.monotonic() - start, 1)
                check(dsn, saver, trial, texts, args.journal)
                trials.append(trial)
                print(f"{n:3d} {kind:9s} {point:11s} {'ok ' if trial.ok else 'BAD'} "
                      f"{trial.seconds:5.1f}s effects={trial.effects} "
                      f"outcomes={','.join(trial.outcomes)} zombie={trial.zombie} {trial.note}",
                      flush=True)  # fmt: skip
    finally:
        rig.stop()
        if server is not None:
            server.stop()
    summary: dict[str, Any] = {
        "orchestrator": args.orchestrator, "journal": args.journal, "sync": args.sync,
        "seed": seed, "trials": len(trials), "ok": sum(t.ok for t in trials),
        "by_kind": dict(collections.Counter(t.kind for t in trials)),
        "bad_by_kind": dict(collections.Counter(t.kind for t in trials if not t.ok)),
        "duplicated_inputs": sum(t.dup_inputs for t in trials),
        "unanswered_tool_calls": sum(t.unanswered for t in trials),
        "stuck_threads": sum(not t.finished for t in trials),
        "reexecuted_finished_effects": sum(t.reexecuted for t in trials),
        "side_effects_per_thread": dict(collections.Counter(t.effects for t in trials)),
        "psycopg_errors": sum(t.psycopg_errors for t in trials),
        # the two deliveries' first attempts: "ok+ConcurrentRunError" (one won at once) or
        # both refused (the run finished on a retry)
        "duplicate_first_round": dict(collections.Counter(
            "+".join(sorted(t.outcomes[:2])) for t in trials if t.kind == "duplicate")),
        "duplicate_winners": dict(collections.Counter(
            t.winners for t in trials if t.kind == "duplicate")),
        "zombie_outcomes": dict(collections.Counter(t.zombie for t in trials if t.zombie)),
        "attempt_outcomes": dict(collections.Counter(o for t in trials for o in t.outcomes)),
        "logs": str(args.logdir),
    }
    print(json.dumps(summary, indent=1))
    if args.keep:
        print("database kept:", dsn)


if __name__ == "__main__":
    main()
