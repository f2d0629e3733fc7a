"""PostgresJournal across real OS processes: SIGKILL mid-op, then a retry elsewhere; two
processes running the same run at once. Postgres is the only thing they share."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from langgraph_deterministic import DeterministicSaver

WORKER = ["-m", "tests.runner._journal_worker"]
_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS journal_effects (thread TEXT, pid INT, what TEXT, "
            "idem TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp())"
        )
    return dsn


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def start(
    db: str, shape: str, thread: str, run: str, tmp: Path, *, pause: str | None = None,
    jitter: bool = False, go: Path | None = None,
) -> subprocess.Popen[str]:
    env = {**os.environ, "LGD_RELEASE": str(tmp / f"release-{os.urandom(4).hex()}")}
    env.pop("LGD_PAUSE_OP", None)
    if pause:
        env["LGD_PAUSE_OP"] = pause
    if jitter:
        env["LGD_JITTER"] = "1"
    if go is not None:
        env["LGD_GO"] = str(go)
    proc = subprocess.Popen(
        [sys.executable, *WORKER, db, shape, thread, run],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _STARTED.append(proc)
    return proc


def effects(db: str, thread: str) -> list[tuple[int, str, str | None, datetime]]:
    with psycopg.connect(db) as conn:
        return conn.execute(
            "SELECT pid, what, idem, at FROM journal_effects WHERE thread = %s ORDER BY at",
            (thread,),
        ).fetchall()


def wait_for(db: str, thread: str, what: str, count: int, proc: subprocess.Popen[str]) -> None:
    """Until ``count`` effects ``<kind>:[<branch>:]<op>`` for ``what`` = ``<kind>:<op>``."""
    kind, _, op = what.partition(":")

    def matches(e: str) -> bool:
        return e.startswith(f"{kind}:") and (e == what or e.endswith(f":{op}"))

    deadline = time.monotonic() + 90
    while sum(matches(e[1]) for e in effects(db, thread)) < count:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early: {proc.communicate()}")
        assert time.monotonic() < deadline, effects(db, thread)
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, dict[str, Any] | None]:
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    stats = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc.returncode, (lines[0] if lines else "") + err, stats


SHAPES = {
    # shape: (op to pause in, how many of them start before the kill, expected result)
    "seq": ("op2", 1, ["v:op1", "v:op2"]),
    # op2 is its node's first op and runs on op1's fence check (no claim of its own)
    "chain": ("op2", 1, ["v:op1", "v:op2"]),
    "fanout": ("op2", 5, sorted(f"v:b{b}:op{i}" for b in range(5) for i in (1, 2))),
    "subgraph": ("op2", 1, ["v:op1", "v:op2"]),
    "gather": ("g3", 1, ["v:g1", "v:g2", "v:g3", "v:op1"]),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_sigkill_during_op2_then_retry_in_another_process(
    db: str, tmp_path: Path, shape: str
) -> None:
    pause, starts, expected = SHAPES[shape]
    thread = f"kill-{shape}"
    proc = start(db, shape, thread, "job-1", tmp_path, pause=pause)
    wait_for(db, thread, f"start:{pause}", starts, proc)
    if shape == "gather":  # the two other ops of the gather completed before the kill
        wait_for(db, thread, "done:g2", 1, proc)
        wait_for(db, thread, "done:g1", 1, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = Counter(e[1] for e in effects(db, thread))

    retry = start(db, shape, thread, "job-1", tmp_path)
    code, out, stats = finish(retry)
    assert code == 0, out
    assert json.loads(out.splitlines()[0]) == expected
    after = effects(db, thread)
    runs = Counter(e[1] for e in after if e[1].startswith("start:"))
    for what in before:
        if what.startswith("done:"):  # completed before the kill: never run again
            assert runs[what.replace("done:", "start:")] == 1, (what, runs)
    paused = [w for w in runs if w.endswith(pause)]
    assert len(paused) == starts
    for what in paused:  # in flight at the kill: run once more, with the same key
        assert runs[what] == 2, runs
        keys = {e[2] for e in after if e[1] == what}
        assert len(keys) == 1
    assert stats is not None and all(k.startswith(pause) for k in stats["executed"])
    assert sum(r.startswith("done:") for r in (e[1] for e in after)) == len(runs)
    if shape == "chain":  # the op killed above ran on the previous node's fence check
        code, _, clean = finish(start(db, shape, f"{thread}-clean", "job-1", tmp_path))
        assert code == 0 and clean is not None, clean
        # op1 on the run's admission (if it started within claim_ahead of it), op2 on op1's
        assert clean["ahead"] in (["op2#0"], ["op1#0", "op2#0"]), clean


def test_two_processes_running_the_same_run_at_once(db: str, tmp_path: Path) -> None:
    """Trials (10 in the default suite; ``LGD_RACE_TRIALS=100`` for a soak): a worker dies
    inside the fan-out, then two retries of the run start at the same moment (a redelivery
    while the first retry runs). No op runs after its result was journaled, and the fenced
    attempt claims no op after the takeover; one attempt finishes the run. The kill point
    cycles through the five branches, so 10 trials still cover each twice."""
    trials = int(os.environ.get("LGD_RACE_TRIALS", "10"))
    outcomes: Counter[str] = Counter()
    duplicate_runs = 0
    fenced_trials = 0
    loser_ops = 0
    for trial in range(trials):
        thread = f"race-{trial}"
        first = start(db, "fanout", thread, "job-1", tmp_path, pause="op2")
        wait_for(db, thread, "start:op1", 1 + trial % 5, first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        go = tmp_path / f"go-{trial}"
        procs = [
            start(db, "fanout", thread, "job-1", tmp_path, jitter=True, go=go) for _ in range(2)
        ]
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob(f"go-{trial}.*"))) < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        go.touch()
        results = [finish(p) for p in procs]
        codes = sorted(r[0] for r in results)
        outcomes[str(codes)] += 1
        assert codes in ([0, 3], [0, 0]), results
        with psycopg.connect(db) as conn:
            completed = dict(
                conn.execute(
                    "SELECT task_ns || '/' || op_key, completed_at FROM lgd_journal "
                    "WHERE thread_id = %s AND status = 'ok'",
                    (thread,),
                ).fetchall()
            )
            fenced = dict(
                conn.execute(
                    "SELECT attempt, fenced_at FROM lgd_journal_attempts "
                    "WHERE thread_id = %s AND fenced_at IS NOT NULL",
                    (thread,),
                ).fetchall()
            )
        assert len(completed) == 10
        fenced_trials += bool(fenced)
        loser_ops += sum(len(r[2]["executed"]) for r in results if r[0] == 3 and r[2])
        for _, _, stats in results:
            assert stats is not None
            for key, claimed in stats["claimed_at"].items():
                claimed_at = datetime.fromisoformat(claimed)
                # 0 executions of an op whose result was already journaled
                assert claimed_at < completed[key], (key, claimed, completed[key])
                # 0 ops run by a fenced attempt after the takeover
                if stats["attempt"] in fenced:
                    assert claimed_at < fenced[stats["attempt"]], (key, stats["attempt"])
        runs = Counter(e[1] for e in effects(db, thread) if e[1].startswith("start:"))
        duplicate_runs += sum(n - 1 for n in runs.values())
        winner = next(r for r in results if r[0] == 0)
        assert json.loads(winner[1].splitlines()[0]) == SHAPES["fanout"][2]
    print(
        f"race: exit codes {dict(outcomes)}; trials with a fenced attempt {fenced_trials}; "
        f"ops the losers ran before the takeover {loser_ops}; extra runs of ops in flight at "
        f"the kill or a takeover {duplicate_runs}"
    )


AGENT = ["-m", "tests.runner._agent_worker"]


def test_create_agent_with_the_middleware_sigkilled_mid_tool(db: str, tmp_path: Path) -> None:
    thread = "agent-kill"
    release = tmp_path / "release-agent"
    env = {**os.environ, "LGD_RELEASE": str(release), "LGD_PAUSE_OP": "slow"}
    proc = subprocess.Popen(
        [sys.executable, *AGENT, db, thread, "job-1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _STARTED.append(proc)
    wait_for(db, thread, "start:slow", 1, proc)
    wait_for(db, thread, "done:fast_a", 1, proc)
    wait_for(db, thread, "done:fast_b", 1, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert Counter(e[1] for e in effects(db, thread))["model"] == 1

    env.pop("LGD_PAUSE_OP")
    retry = subprocess.Popen(
        [sys.executable, *AGENT, db, thread, "job-1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _STARTED.append(retry)
    out, err = retry.communicate(timeout=120)
    assert retry.returncode == 0, err
    answer, stats_line = out.strip().splitlines()[-2:]
    assert answer == "answer from result of fast_a, result of fast_b, result of slow"
    seen = Counter(e[1] for e in effects(db, thread))
    # the first model call and the two finished tools ran once; the killed tool once more;
    # the retry called the model once, for the answer
    assert seen["model"] == 2
    assert seen["start:fast_a"] == seen["start:fast_b"] == 1
    assert seen["start:slow"] == 2 and seen["done:slow"] == 1
    stats = json.loads(stats_line)
    assert sorted(stats["executed"]) == ["model#0", "tool:slow:call-slow#0"]
    with psycopg.connect(db) as conn:
        ops = dict(
            conn.execute(
                "SELECT op_key, executions FROM lgd_journal WHERE thread_id = %s AND status = 'ok'",
                (thread,),
            ).fetchall()
        )
    assert ops["tool:slow:call-slow#0"] == 2 and ops["tool:fast_a:call-fast_a#0"] == 1
