"""What the retry contract knows about one saver call (:class:`CallInfo`), read from its
config by :meth:`~.contract.RunContract.call_info`. Its own module, so that both the
contract's decisions and the SQLSTATE translation (``_sqlstate``) read it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langgraph_deterministic.checkpointer._keys import MultitaskStrategy
from langgraph_deterministic.checkpointer._recorder import RunInputRecorder


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What the contract needs to know about one saver call, read from its config."""

    thread_id: str
    checkpoint_ns: str
    run_id: str | None
    #: the run id exactly as given (a ``uuid.UUID`` stays one), for LangGraph's own check
    raw_run_id: Any
    in_graph_run: bool
    fingerprint: str | None
    attempt: str | None
    addressed: bool
    #: whether the config carries the RunInputRecorder of run_config
    recorded: bool = False
    #: the top-level config["run_id"] (LangChain's tracing id) when it is the only run id
    tracing_id: Any = None
    #: the per-call multitask strategy (run_config(..., multitask_strategy=...))
    strategy: MultitaskStrategy | None = None
    #: the checkpoint this graph run branches from on purpose (see BRANCH_KEY)
    branch_from: str | None = None
    #: a subgraph write of a graph run that branches at its root (see BRANCHING)
    inherited_branch: bool = False
    recorder: RunInputRecorder | None = None
    #: what a root graph run loaded (HEAD_KEY): read by guard_put
    head: str | None = None
    #: what a call of a run that had finished does (ON_FINISHED_KEY): "return" or "raise"
    on_finished: str = "return"

    @property
    def root(self) -> bool:
        return self.checkpoint_ns == ""
