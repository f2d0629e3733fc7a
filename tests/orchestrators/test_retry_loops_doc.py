"""docs/how-to/retry-loops.md as written: its job entry point (the page's block, as the
file ``agent/job.py``, beside an ``agent/graph.py`` of the test's), started as the page's
Job starts it, SIGKILLed mid-run and started again (a Job's next pod), resumes the same
run; a permanent error exits 3, which the page's Job ends on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.retry import EXIT_PERMANENT

REPO = Path(__file__).resolve().parents[2]
TEXT = (REPO / "docs" / "how-to" / "retry-loops.md").read_text("utf-8")

PRELUDE = '''
import operator, os, time
from pathlib import Path
from typing import Annotated, TypedDict
from langgraph.graph import START, StateGraph

class State(TypedDict, total=False):
    items: Annotated[list[str], operator.add]

MARK = Path(os.environ["MARK"])


def job_input() -> State:
    return {"items": [os.environ.get("JOB_INPUT", "ticket text")]}

def work(state: State) -> State:
    if not MARK.exists():
        MARK.touch()
        while True:  # the pod is killed here
            time.sleep(0.05)
    return {"items": ["answered"]}

def build(saver):
    graph = StateGraph(State).add_node("work", work).add_edge(START, "work")
    return graph.compile(checkpointer=saver)
'''


def block(lang: str) -> str:
    (found,) = re.findall(rf"```{lang}\n(.*?)```", TEXT, flags=re.DOTALL)
    return found


def test_the_job_resumes_after_a_kill_and_fails_for_good_on_a_permanent_error(
    db: str, tmp_path: Path
) -> None:
    code = block("python")
    assert code.startswith("# agent/job.py\n")
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "__init__.py").write_text("")
    (tmp_path / "agent" / "graph.py").write_text(PRELUDE)
    (tmp_path / "agent" / "job.py").write_text(code)
    command = [sys.executable, "-m", "agent.job"]  # the Job's container command
    job = f"triage-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "DATABASE_URL": db, "JOB_NAME": job, "THREAD_ID": job,
           "MARK": str(tmp_path / "mark"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")])}  # fmt: skip
    with DeterministicSaver(db) as saver:
        saver.setup()
    pod = subprocess.Popen(command, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "mark").exists():
        assert pod.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    pod.send_signal(signal.SIGKILL)  # the node is drained mid-run
    pod.wait()
    again = subprocess.run(command, env=env, timeout=60, cwd=tmp_path)
    assert again.returncode == 0
    with DeterministicSaver(db) as saver:
        values = saver.get_tuple({"configurable": {"thread_id": job}})
        assert values is not None
        assert values.checkpoint["channel_values"]["items"] == ["ticket text", "answered"]
        run = saver.get_run(job, f"job:{job}")
        assert run is not None and run.attempts == 2
    other = subprocess.run(command, env={**env, "JOB_INPUT": "other"}, cwd=tmp_path,
                           timeout=60, capture_output=True, text=True)  # fmt: skip
    assert other.returncode == EXIT_PERMANENT, other.stderr
    assert "RunInputMismatchError" in other.stderr


def test_the_job_spec_fails_on_the_permanent_exit_code() -> None:
    spec = yaml.safe_load(block("yaml"))
    rules = spec["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob"
    assert rules[0]["onExitCodes"]["values"] == [EXIT_PERMANENT]
    (container,) = spec["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "agent.job"]  # the page's entry point
    env = {e["name"]: e for e in container["env"]}
    assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/job-name']"
    )
    assert "JOB_NAME" in block("python") and "THREAD_ID" in block("python")
