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
#: Configurable key the saver hands to a graph run through ``get_tuple``; LangGraph copies
#: it into the config of every write of that run attempt (never into stored metadata).
ATTEMPT_KEY = "__lgd_attempt"
#: Present in the configurable of every config a running graph passes to its saver.
GRAPH_RUN_MARKER = CONFIG_KEY_RUNTIME
#: Configurable key of a per-call multitask strategy (set by run_config).
MULTITASK_KEY = "__lgd_multitask_strategy"
#: Configurable key ``get_tuple`` hands a graph run addressed at a past checkpoint: the
#: checkpoint it branches from on purpose (LangGraph copies it into the run's writes).
BRANCH_KEY = "__lgd_branch"
#: The branch a root graph run loaded in this context: (thread, run id, branch point,
#: whether LangGraph's superseded probe is still to come: see _core._note_branch).
#: LangGraph hands its subgraphs neither the root's loaded config nor our keys in it, but
#: runs their tasks in copies of this context, so a subgraph of a branching run learns it
#: here (for the same thread and run id only: the value outlives the call).
BRANCHING: contextvars.ContextVar[tuple[str, str | None, str, bool] | None] = (
    contextvars.ContextVar("lgd_branching", default=None)
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
