"""The names the retry contract reads and writes in configs and metadata, and its enums."""

from __future__ import annotations

import contextvars
from typing import Any, Literal, get_args

from langgraph_deterministic._compat.langgraph import CONFIG_KEY_RUNTIME
from langgraph_deterministic.errors import ConfigurationError

Policy = Literal["require", "warn", "off"]
#: What a graph run does when another run holds its thread, or the previous run stopped
#: unfinished (LangGraph Platform's names).
MultitaskStrategy = Literal["reject", "enqueue", "interrupt", "rollback"]
STRATEGIES: tuple[str, ...] = get_args(MultitaskStrategy)
InputKind = Literal["input", "command", "none"]

#: Metadata key of the run id (LangGraph's own: ``PregelLoop._first`` compares it).
RUN_ID_KEY = "run_id"
#: Metadata key under which the input fingerprint of a run is stored.
FINGERPRINT_KEY = "input_fingerprint"
# The keys get_tuple hands a graph run start with "__pregel_": LangGraph copies the loaded
# config into the config of every write of the run (which is how they reach put), and into
# what its "debug" and "checkpoints" streams emit, from which it removes "__pregel_" keys
# (pregel/debug.py, rm_pregel_keys). So a streamed checkpoint's config is the one
# get_state_history returns, as with PostgresSaver (LangGraph's test_debug_retry).
#: Configurable key the saver hands to a graph run through ``get_tuple``; LangGraph copies
#: it into the config of every write of that run attempt (never into stored metadata).
ATTEMPT_KEY = "__pregel_lgd_attempt"
#: Present in the configurable of every config a running graph passes to its saver.
GRAPH_RUN_MARKER = CONFIG_KEY_RUNTIME
#: Configurable key of a per-call multitask strategy (set by run_config).
MULTITASK_KEY = "__lgd_multitask_strategy"
#: Configurable key of what a call does when its run had finished already (set by
#: run_config(..., on_finished="raise")): "return" its final state (logged) or "raise".
ON_FINISHED_KEY = "__lgd_on_finished"
#: Configurable key ``get_tuple`` hands a graph run addressed at a past checkpoint: the
#: checkpoint it branches from on purpose (LangGraph copies it into the run's writes).
BRANCH_KEY = "__pregel_lgd_branch"
#: Configurable key ``get_tuple`` hands a root graph run: the checkpoint it loaded, that
#: checkpoint's run id and progress digest (JSON), so that its first write can tell
#: whether the previous run had finished (contract.guard_put; LangGraph copies it into
#: the run's writes).
HEAD_KEY = "__pregel_lgd_head"
#: The time travel a root graph run loaded in this context: (thread, run id, the root's
#: attempt token, whether LangGraph's superseded probe is still to come: see
#: _core._note_branch). A root run addressed at any checkpoint travels in time: LangGraph
#: then has its subgraphs reload their state from before that point, continuing
#: checkpoints of their namespaces that another run continued already. LangGraph hands
#: its subgraphs neither the root's loaded config nor our keys in it, but runs their tasks
#: in copies of this context, so a subgraph learns it here (for the same thread and run id
#: only: the value outlives the call), and takes the root's attempt token where it has
#: none of its own (the first checkpoint of its namespace: it loaded nothing).
BRANCHING: contextvars.ContextVar[tuple[str, str | None, str, bool] | None] = (
    contextvars.ContextVar("lgd_branching", default=None)
)
#: The run id of the latest call outside a graph run that carried one, in this context:
#: (thread, run id, the checkpoint ids its calls handed out or stored, "" for "none").
#: LangGraph's update_state passes the saver's *returned* configs (which name only the
#: thread, namespace and checkpoint, as the peer's do) to its next saver call: the copy
#: of ``as_node="__copy__"`` (written with the loaded tuple's parent_config), the pending
#: writes and the next superstep of ``bulk_update_state``. A call without a run id on the
#: same thread, outside a graph run, addressed at one of those checkpoints, is part of
#: that update and keeps its run id; any other such call on the thread ends the carry
#: (see RunContract.call_info, contract.carry_run_id).
CARRIED: contextvars.ContextVar[tuple[str, str, frozenset[str]] | None] = (
    contextvars.ContextVar("lgd_carried", default=None)
)

#: Configurable keys copied into stored checkpoint metadata unless told otherwise.
#: LangGraph copies every str/int/float/bool configurable value (API keys included);
#: we copy only these. ``config["metadata"]`` (what you chose to attach) is still kept,


def check_strategy(value: Any) -> MultitaskStrategy:
    if value not in STRATEGIES:
        raise ConfigurationError(
            f"multitask_strategy must be one of {', '.join(map(repr, STRATEGIES))}, not {value!r}."
        )
    return value  # type: ignore[no-any-return]
