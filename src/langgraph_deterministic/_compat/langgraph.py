"""The private LangGraph and langchain-core names this package relies on, in one place.

Imported from the library where it defines them (never copied as strings), and checked
once when this module is imported: a LangGraph upgrade that moves one raises
:class:`~langgraph_deterministic.errors.IncompatibleLangGraphError` here, naming the
supported versions, instead of misbehaving later. What only DeterministicRunner needs
(the task-submit hook) is checked by :func:`check_runner_hooks`, once per process.

What each name is for:

* ``CONFIG_KEY_RUNTIME`` (``__pregel_runtime``): present in the configurable of every
  config a running graph passes to its saver; how the saver tells a graph run from
  ``get_state`` / ``update_state``. Its ``execution_info`` addresses PostgresJournal ops.
* ``CONFIG_KEY_RUNNER_SUBMIT`` (``__pregel_runner_submit``): where ``PregelRunner`` takes
  its task-submit function from; DeterministicRunner installs its own there.
* ``PUSH`` / ``PULL``: the first element of a task's path (task keys of the runner).
* ``NULL_TASK_ID``: the task id of the writes of a ``Command`` input (the retry contract
  refuses a replayed Command).
* ``INTERRUPT`` (``__interrupt__``): the pending-write channel of an interrupt.
* ``TASKS`` (``__pregel_tasks``): the channel of pending Sends (the fold of pre-v4
  checkpoints, repair).
* ``START`` (``__start__``): the channel of a graph's input (repair closes its step).
* :func:`branch_to` (``branch:to:``, from ``langgraph.graph.state._CHANNEL_BRANCH_TO``):
  the prefix of the channel that triggers a node (repair closes the triggers left);
  checked when first asked for, as importing ``langgraph.graph`` costs the package's
  import time.
* ``NS_SEP``: separator of checkpoint namespaces (the graph scope of a node).
* ``DeltaSnapshot`` (``langgraph.checkpoint.serde.types._DeltaSnapshot``): a DeltaChannel
  value kept in a blob with an inline marker.
* ``var_child_runnable_config``: the config of the running node (langchain-core).
* the submit keywords of LangGraph's executors (``SUBMIT_KEYWORDS``), which the runner's
  submit function accepts; ``__reraise_on_exit__`` is honoured as LangGraph's executor
  does at the end of a run, skipping the futures LangGraph puts in its
  ``SKIP_RERAISE_SET`` (:func:`skips_reraise`).
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from langgraph_deterministic._compat import incompatible_message, supported
from langgraph_deterministic.errors import IncompatibleLangGraphError

#: The LangGraph versions this package supports (pyproject's requirement).
SUPPORTED_LANGGRAPH = supported("langgraph", ">=1.2.18,<1.3")


def incompatible(what: str) -> IncompatibleLangGraphError:
    return IncompatibleLangGraphError(
        incompatible_message(
            "langgraph",
            what,
            SUPPORTED_LANGGRAPH,
            user="langgraph-deterministic",
            beside=("langchain-core", "langgraph-checkpoint"),
        )
    )


try:
    from langchain_core.runnables.config import var_child_runnable_config
    from langgraph._internal._constants import (
        CONFIG_KEY_RUNNER_SUBMIT,
        CONFIG_KEY_RUNTIME,
        INTERRUPT,
        NS_SEP,
        NULL_TASK_ID,
        PULL,
        PUSH,
        TASKS,
    )
    from langgraph.checkpoint.serde.types import TASKS as _CHECKPOINT_TASKS
    from langgraph.checkpoint.serde.types import _DeltaSnapshot as DeltaSnapshot
    from langgraph.constants import START
except ImportError as exc:
    raise incompatible(f"lacks a name ({exc})") from exc

if _CHECKPOINT_TASKS != TASKS:
    raise incompatible(
        f"names the Send channel {TASKS!r} in langgraph and {_CHECKPOINT_TASKS!r} in "
        "langgraph-checkpoint"
    )
if not isinstance(DeltaSnapshot, type):
    raise incompatible("has no _DeltaSnapshot class in langgraph.checkpoint.serde.types")

#: Keyword arguments LangGraph passes to a submit function besides the task's own.
SUBMIT_KEYWORDS = ("__name__", "__cancel_on_exit__", "__reraise_on_exit__", "__next_tick__")
#: Fields of ``PregelExecutableTask`` the runner reads.
TASK_FIELDS = frozenset({"name", "path", "config", "id"})


@cache
def check_runner_hooks() -> None:
    """Check (once per process, cached) what DeterministicRunner hooks into: the submit
    function taken from the config, the executor keywords, the task fields and the
    runtime's ``execution_info``. Structural checks only: no source is read."""
    try:
        from langgraph.pregel._executor import AsyncBackgroundExecutor
        from langgraph.pregel.main import Pregel
        from langgraph.runtime import Runtime
        from langgraph.types import PregelExecutableTask
    except ImportError as exc:
        raise incompatible(f"lacks the modules the runner hooks into ({exc})") from exc
    # Pregel.astream must read the submit function from the config: the constant is a
    # global its code refers to (a structural check; the source is not read).
    if "CONFIG_KEY_RUNNER_SUBMIT" not in _code_names(Pregel.astream):
        raise incompatible("has a Pregel.astream that does not take its submit function "
                           "from the config")  # fmt: skip
    params = inspect.signature(AsyncBackgroundExecutor.submit).parameters
    if missing := [k for k in SUBMIT_KEYWORDS if k not in params]:
        raise incompatible(f"has an executor submit() without {missing}")
    fields = set(getattr(PregelExecutableTask, "__dataclass_fields__", {}))
    if missing_fields := sorted(TASK_FIELDS - fields):
        raise incompatible(f"has a PregelExecutableTask without {missing_fields}")
    if "execution_info" not in getattr(Runtime, "__dataclass_fields__", {}):
        raise incompatible("has a Runtime without execution_info")
    try:
        from langgraph.pregel._executor import SKIP_RERAISE_SET
    except ImportError as exc:
        raise incompatible(f"lacks the executor's SKIP_RERAISE_SET ({exc})") from exc
    if not hasattr(SKIP_RERAISE_SET, "__contains__"):
        raise incompatible("has a SKIP_RERAISE_SET that is not a set")


@cache
def branch_to() -> str:
    """The prefix of the channel that triggers a node: ``branch_to() + node``."""
    try:
        from langgraph.graph.state import _CHANNEL_BRANCH_TO
    except ImportError as exc:
        raise incompatible(f"lacks the trigger channel of a node ({exc})") from exc
    if not (isinstance(_CHANNEL_BRANCH_TO, str) and _CHANNEL_BRANCH_TO.endswith("{}")):
        raise incompatible(f"names a node's trigger channel {_CHANNEL_BRANCH_TO!r}")
    return _CHANNEL_BRANCH_TO.removesuffix("{}")


def skips_reraise(future: object) -> bool:
    """Whether LangGraph's executor would not re-raise ``future``'s error on exit (the
    futures of ``call()`` tasks, whose errors go to their parent task)."""
    from langgraph.pregel._executor import SKIP_RERAISE_SET

    return future in SKIP_RERAISE_SET


def _code_names(fn: Any) -> tuple[str, ...]:
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    return tuple(code.co_names) if code is not None else ()


__all__ = [
    "CONFIG_KEY_RUNNER_SUBMIT",
    "CONFIG_KEY_RUNTIME",
    "INTERRUPT",
    "NS_SEP",
    "NULL_TASK_ID",
    "PULL",
    "PUSH",
    "START",
    "SUBMIT_KEYWORDS",
    "SUPPORTED_LANGGRAPH",
    "TASKS",
    "TASK_FIELDS",
    "DeltaSnapshot",
    "branch_to",
    "check_runner_hooks",
    "incompatible",
    "skips_reraise",
    "var_child_runnable_config",
]
