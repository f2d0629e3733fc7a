"""The retry contract's decisions (checkpointer/contract.py and the modules it is made of), without a database: what a
config says about a call, whether a graph run may start, what goes into a write, and
which error each guard SQLSTATE becomes."""

from __future__ import annotations

import datetime as dt
import logging
import pickle
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import CheckpointTuple

from langgraph_deterministic import run_config
from langgraph_deterministic._compat.langgraph import INTERRUPT, NULL_TASK_ID
from langgraph_deterministic.checkpointer._keys import (
    ATTEMPT_KEY,
    BRANCH_KEY,
    FINGERPRINT_KEY,
    GRAPH_RUN_MARKER,
)
from langgraph_deterministic.checkpointer._ledger import Admission, HeldLease, LedgerRow
from langgraph_deterministic.checkpointer._recorder import RunInputRecorder
from langgraph_deterministic.checkpointer._sqlstate import translate_guard_error
from langgraph_deterministic.checkpointer.contract import (
    RunContract,
    StartDecision,
    unanswered_tool_calls,
)
from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DeterministicError,
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    RunUnfinishedError,
)

from .fake_db import PgError

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def info_of(config: Any, contract: RunContract | None = None, ns: str = "") -> Any:
    contract = contract or RunContract()
    return contract.call_info(config, config["configurable"]["thread_id"], ns)


def graph_run(run: str = "r1", fingerprint: str | None = "input:aa", **configurable: Any) -> Any:
    config = run_config("t1", run, **configurable)
    config["configurable"][GRAPH_RUN_MARKER] = object()
    config["callbacks"][0].fingerprint = fingerprint
    return config


# --- what call is this? -----------------------------------------------------------------


def test_run_id_is_read_from_metadata_or_configurable_and_normalised() -> None:
    u = uuid.UUID(int=7)
    meta = info_of({"configurable": {"thread_id": "t"}, "metadata": {"run_id": u}})
    assert (meta.run_id, meta.raw_run_id) == (str(u), u)
    conf = info_of({"configurable": {"thread_id": "t", "run_id": "r"}})
    assert conf.run_id == "r" and not conf.in_graph_run and not conf.recorded
    tracing = info_of({"configurable": {"thread_id": "t"}, "run_id": u})
    assert tracing.run_id is None and tracing.tracing_id == u


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"configurable": {"thread_id": "t"}, "metadata": {"run_id": "  "}}, "empty string"),
        ({"configurable": {"thread_id": "t"}, "metadata": {"run_id": 42}}, "is a int"),
        (
            {"configurable": {"thread_id": "t", "run_id": "b"}, "metadata": {"run_id": "a"}},
            "differ",
        ),
    ],
)
def test_unusable_run_ids_are_refused(config: Any, match: str) -> None:
    with pytest.raises(RunIdRequiredError, match=match):
        info_of(config)
    # policy "off" stores what it can and never refuses
    assert info_of(config, RunContract("off")).run_id is None


def test_graph_run_markers_attempt_branch_and_strategy_are_read() -> None:
    config = graph_run(multitask_strategy="enqueue")
    config["configurable"].update({ATTEMPT_KEY: "att", BRANCH_KEY: "c3", "checkpoint_id": "c3"})
    info = info_of(config)
    assert info.in_graph_run and info.recorded and info.addressed
    assert (info.attempt, info.branch_from, info.strategy, info.fingerprint) == (
        "att", "c3", "enqueue", "input:aa",
    )  # fmt: skip
    config["configurable"]["__lgd_multitask_strategy"] = "sometimes"
    with pytest.raises(ConfigurationError, match="multitask_strategy must be one of"):
        info_of(config)


# --- policy ---------------------------------------------------------------------------------


def test_require_refuses_and_warn_logs_once_per_thread(caplog: pytest.LogCaptureFixture) -> None:
    bare = {"configurable": {"thread_id": "t"}}
    with pytest.raises(RunIdRequiredError, match='run_id_policy="require"'):
        RunContract("require").require_run_id(info_of(bare), "A write")
    tracing = {**bare, "run_id": uuid.UUID(int=1)}
    with pytest.raises(RunIdRequiredError, match="LangChain's tracing id"):
        RunContract("require").require_run_id(info_of(tracing), "A write")
    warn = RunContract("warn")
    with caplog.at_level(logging.WARNING, logger="langgraph_deterministic"):
        for _ in range(3):
            warn.require_run_id(info_of(bare, warn), "A write")
    assert len([r for r in caplog.records if "carries no run id" in r.message]) == 1
    RunContract("off").require_run_id(info_of(bare, RunContract("off")), "A write")


# --- may this graph run start? ---------------------------------------------------------------


HEAD_OF_R1 = {"run_id": "r1", FINGERPRINT_KEY: "input:aa"}
HEAD_OF_R2 = {"run_id": "r2", FINGERPRINT_KEY: "input:bb"}


@pytest.mark.parametrize(
    ("fingerprint", "head", "ledger", "outcome"),
    [
        ("input:aa", None, None, StartDecision("proceed")),  # a new thread
        ("input:aa", HEAD_OF_R1, None, StartDecision("proceed")),  # a retry: resume
        ("input:zz", HEAD_OF_R1, None, RunInputMismatchError),  # same run id, other input
        ("command:cc", {"run_id": "r1"}, None, RunSupersededError),  # a Command redelivered
        ("input:aa", HEAD_OF_R2, None, StartDecision("proceed")),  # a new run
        ("input:aa", HEAD_OF_R2, LedgerRow("done", "c5", "input:aa"), StartDecision("final", "c5")),
        ("input:zz", HEAD_OF_R2, LedgerRow("done", "c5", "input:aa"), RunInputMismatchError),
        ("command:cc", HEAD_OF_R2, LedgerRow("done", "c5", "command:cc"), RunSupersededError),
        ("input:aa", HEAD_OF_R2, LedgerRow("running", "c5", "input:aa"), RunSupersededError),
        ("input:aa", HEAD_OF_R2, LedgerRow("rolled_back", None, "input:aa"), RunSupersededError),
    ],
    ids=[
        "new-thread", "retry", "retry-other-input", "command-twice", "new-run",
        "late-retry-of-finished", "late-retry-other-input", "late-command",
        "late-retry-of-unfinished", "rolled-back",
    ],
)  # fmt: skip
def test_decide_start(
    fingerprint: str, head: dict[str, Any] | None, ledger: LedgerRow | None, outcome: Any
) -> None:
    info = info_of(graph_run(fingerprint=fingerprint))
    contract = RunContract()
    if isinstance(outcome, StartDecision):
        assert contract.decide_start(info, head, ledger) == outcome
    else:
        with pytest.raises(outcome, match=r"(?i)nothing was run or written"):
            contract.decide_start(info, head, ledger)


def test_decide_start_without_run_config_recorder() -> None:
    config = graph_run()
    config["callbacks"] = []
    with pytest.raises(RunIdRequiredError, match="not made by run_config"):
        RunContract().decide_start(info_of(config), None, None)
    warn = RunContract("warn")
    assert warn.decide_start(info_of(config, warn), None, None) == StartDecision("proceed")


def _head(values: dict[str, Any], writes: list[Any] | None = None) -> CheckpointTuple:
    config: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    checkpoint: Any = {"channel_values": values}
    return CheckpointTuple(config, checkpoint, {}, None, writes or [])


def test_a_head_stuck_on_an_unanswered_tool_call_is_refused_for_new_input() -> None:
    call = AIMessage("", tool_calls=[{"id": "call-1", "name": "refund", "args": {}}])
    stuck = _head({"messages": [HumanMessage("hi"), call]})
    info = info_of(graph_run())
    with pytest.raises(RunUnfinishedError, match="call-1"):
        RunContract().check_stuck_head(info, stuck, "input")
    RunContract().check_stuck_head(info, stuck, "command")  # a resume answers it
    interrupted = _head(stuck.checkpoint["channel_values"], [("t", INTERRUPT, "ask")])
    RunContract().check_stuck_head(info, interrupted, "input")  # waiting on purpose
    answered = _head({"messages": [call, ToolMessage("ok", tool_call_id="call-1")]})
    RunContract().check_stuck_head(info, answered, "input")


def test_unanswered_tool_calls_reads_the_last_ai_message_of_each_list() -> None:
    ai = AIMessage(
        "", tool_calls=[{"id": "a", "name": "x", "args": {}}, {"id": "b", "name": "x", "args": {}}]
    )
    values = {"messages": [ai, ToolMessage("r", tool_call_id="a")], "other": [1, 2], "n": 3}
    assert unanswered_tool_calls(values) == ["b"]
    older = AIMessage("", tool_calls=[{"id": "z", "name": "x", "args": {}}])
    assert unanswered_tool_calls({"m": [older, AIMessage("done")]}) == []


# --- what goes into a write? ------------------------------------------------------------------


def test_stored_metadata_keeps_langgraphs_keys_and_drops_secrets() -> None:
    config = graph_run(assistant_id="bot", api_key="sk-x", tenant="acme")
    config["metadata"].update(
        {
            "user": "ann",
            "db_pwd": "hunter2",
            "note": "Bearer abc.def",
            "callback": "https://u:pw@host/x",
            "nul": "a\u0000b",
        }
    )
    info = info_of(config)
    stored = RunContract().stored_metadata(
        config, {"source": "loop", "step": 1, "writes": {}}, info
    )
    assert stored == {
        "source": "loop", "step": 1, "run_id": "r1", "user": "ann", "nul": "ab",
        "assistant_id": "bot", FINGERPRINT_KEY: "input:aa",
    }  # fmt: skip
    sub = RunContract().stored_metadata(config, {}, info_of(config, ns="child:1"))
    assert FINGERPRINT_KEY not in sub  # the input belongs to the root graph's checkpoints


def test_guard_parameters_of_a_command_an_interrupt_and_a_branch() -> None:
    contract = RunContract()
    config = graph_run(fingerprint="command:cc")
    config["configurable"].update({ATTEMPT_KEY: "att", BRANCH_KEY: "c3"})
    info = info_of(config)
    assert contract.guard_put(info, "c3", {}, "loop") == {
        "run_id": "r1", "attempt": "att", "fingerprint": "command:cc", "ledger": True,
        "branch": True, "closes": None, "closes_run": None,
    }  # fmt: skip
    guard = contract.guard_put(info, "c9", {}, "loop")
    assert guard is not None and guard["branch"] is False
    command = contract.guard_writes(info, "c3", NULL_TASK_ID, ["__resume__"])
    assert command is not None and command["command"] and not command["interrupted"]
    assert command["slot"] == "c3~r1"  # the branch's own lineage slot at its branch point
    interrupt = contract.guard_writes(info, "c4", "task-1", [INTERRUPT])
    assert interrupt is not None and interrupt["interrupted"] and not interrupt["command"]
    assert interrupt["slot"] == "c4"
    off = RunContract("off")
    assert off.guard_put(info, "c3", {}, "loop") is None
    assert off.guard_writes(info, "c3", "t", []) is None


def test_update_state_outside_a_run_is_deliberate_a_graph_runs_write_is_not() -> None:
    contract = RunContract()
    outside = info_of({"configurable": {"thread_id": "t1"}, "metadata": {"run_id": "r"}})
    # parent None: update_state(as_node="__copy__") of a thread's first checkpoint
    assert contract.deliberate(outside, "c1") and contract.deliberate(outside, None)
    assert not contract.deliberate(info_of(graph_run()), "c1")
    assert not contract.deliberate(info_of(graph_run()), None)  # a new thread's first write


@pytest.mark.parametrize(
    ("state", "error"),
    [
        ("LG409", ConcurrentRunError),
        ("LG410", ConcurrentRunError),
        ("LG411", ConfigurationError),
        ("LG412", RunSupersededError),
        ("LG413", ConcurrentRunError),
    ],
)
def test_each_guard_sqlstate_becomes_our_error(state: str, error: type[DeterministicError]) -> None:
    translated = translate_guard_error(PgError(state, "the detail"), info_of(graph_run()))
    assert type(translated) is error
    assert "'t1'" in str(translated)  # names the thread...
    assert "the detail" in str(translated) or state == "LG412"  # ...and the database's reason
    assert translate_guard_error(PgError("23505"), info_of(graph_run())) is None
    assert translate_guard_error(ValueError("x"), info_of(graph_run())) is None


@pytest.mark.parametrize("state", ["LG409", "LG410"])
def test_a_lost_checkpoint_race_names_its_winner_in_typed_fields(state: str) -> None:
    race = PgError(state, "checkpoint c1 was continued by attempt a2 of run r-win")
    error = translate_guard_error(race, info_of(graph_run()))
    assert isinstance(error, ConcurrentRunError)
    assert error.lost_to_run == "r-win" and error.checkpoint_race
    # The fields survive pickling (Celery and multiprocessing send errors that way).
    again = pickle.loads(pickle.dumps(error))
    assert (again.lost_to_run, again.checkpoint_race, str(again)) == ("r-win", True, str(error))
    no_winner = translate_guard_error(PgError(state, "no run named"), info_of(graph_run()))
    assert isinstance(no_winner, ConcurrentRunError) and no_winner.lost_to_run is None


def test_another_runs_lease_is_no_checkpoint_race() -> None:
    error = translate_guard_error(PgError("LG413", "held by run r0"), info_of(graph_run()))
    assert isinstance(error, ConcurrentRunError)
    assert error.lost_to_run is None and not error.checkpoint_race


def test_admission_row() -> None:
    row = ("busy", None, "r0", "att-0", NOW, None, "reject", "free", NOW, None)
    admission = Admission.from_row(row)
    assert admission.verdict == "busy" and admission.holder is not None
    assert admission.holder.run_id == "r0" and admission.holder.live(NOW - dt.timedelta(seconds=1))
    assert not admission.holder.live(NOW)
    assert (
        Admission.from_row(
            ("admitted", None, None, None, None, None, None, None, None, "free")
        ).holder
        is None
    )


# --- the input recorder ----------------------------------------------------------------------


def test_recorder_fingerprints_the_root_call_only_and_survives_config_copies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import copy

    recorder = RunInputRecorder()
    assert copy.deepcopy(recorder) is recorder and copy.copy(recorder) is recorder
    call = uuid.uuid4()
    recorder.on_chain_start(None, {"q": 1}, run_id=call)
    root = recorder.fingerprint
    assert root is not None and root.startswith("input:")
    recorder.on_chain_start(None, {"q": 2}, run_id=uuid.uuid4(), parent_run_id=call)
    assert recorder.fingerprint == root  # a child chain's input is not the call's
    # A graph invoked inside a node of this call: its root chain has a parent, and is
    # still not this call's.
    recorder.on_chain_start(None, {"q": 3}, run_id=uuid.uuid4(), parent_run_id=uuid.uuid4())
    assert recorder.fingerprint == root
    recorder.on_chain_end({}, run_id=call)  # the call is over: the config's next call
    with caplog.at_level(logging.WARNING, logger="langgraph_deterministic"):
        recorder.on_chain_start(None, {"q": object()}, run_id=uuid.uuid4())
    assert recorder.fingerprint is None
    assert "cannot fingerprint" in caplog.text


@pytest.mark.parametrize(
    ("error", "ends"),
    [
        (ConcurrentRunError("lost", lost_to_run="r1", checkpoint_race=True), "lost"),
        (ConcurrentRunError("lost", lost_to_run="r2", checkpoint_race=True), "error"),
        (ConcurrentRunError("leased"), "error"),
        (ValueError("node bug"), "error"),
    ],
)
def test_a_race_lost_to_its_own_run_ends_the_lease_lost(error: Exception, ends: str) -> None:
    released: list[str] = []
    recorder = RunInputRecorder()
    call = uuid.uuid4()
    recorder.on_chain_start(None, {"q": 1}, run_id=call)
    recorder.held = HeldLease("t1", "r1", "att-1")
    recorder.bind_release(released.append, is_async=False)
    recorder.on_chain_error(error, run_id=call)
    assert released == [ends]


def test_recorder_releases_once_when_the_root_call_ends() -> None:
    released: list[str] = []
    recorder = RunInputRecorder()
    call = uuid.uuid4()
    recorder.on_chain_start(None, {"q": 1}, run_id=call)
    recorder.bind_release(released.append, is_async=False)
    assert recorder.bound
    recorder.on_chain_end({}, run_id=uuid.uuid4(), parent_run_id=call)  # a child
    recorder.on_chain_end({}, run_id=uuid.uuid4())  # another call's root (nested inside)
    assert released == []
    recorder.on_chain_error(ValueError(), run_id=call)
    recorder.on_chain_end({}, run_id=call)
    assert released == ["error"] and not recorder.bound
