"""``run_config``: the config of one graph call under the retry contract."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig

from langgraph_deterministic.checkpointer.contract import (
    MULTITASK_KEY,
    ON_FINISHED_KEY,
    RUN_ID_KEY,
    MultitaskStrategy,
    RunInputRecorder,
    check_strategy,
)
from langgraph_deterministic.errors import ConfigurationError, RunIdRequiredError

__all__ = ["run_config"]


def run_config(
    thread_id: str | uuid.UUID,
    run_id: str | uuid.UUID,
    *,
    multitask_strategy: MultitaskStrategy | None = None,
    on_finished: Literal["return", "raise"] = "return",
    **configurable: Any,
) -> RunnableConfig:
    """The config for one graph call: ``graph.invoke(input, run_config(thread, run))``.

    ``run_id`` names the *call*, not the attempt: use the same id every time the same call
    is retried (a Temporal workflow id plus a step name, a Celery task id, an idempotency
    key from your API), and a new id for new work -- including each ``Command(resume=...)``
    that answers an interrupt. With a :class:`DeterministicSaver` this makes a retry safe:
    the input is applied once, finished tasks do not run again, a retry with another input
    or a late retry after a later run is refused before anything runs, and two attempts
    running at once cannot both write (see docs/explanation/retries-and-idempotency.md).

    The run id goes where LangGraph looks for it (``metadata.run_id``, compared with the
    latest checkpoint's) and in ``configurable.run_id``; a ``uuid.UUID`` becomes its string
    form. Extra keyword arguments go to ``configurable`` (``checkpoint_ns``, your own
    keys...). The config also carries a small callback that fingerprints the call's input
    for the saver; build one config per call.

    ``multitask_strategy`` overrides the saver's for this call: what to do when another
    run holds the thread, or the previous run stopped unfinished -- ``"reject"``,
    ``"enqueue"``, ``"interrupt"`` or ``"rollback"`` (see "Concurrent runs on one thread"
    in docs/explanation/retries-and-idempotency.md).

    ``on_finished``: what a call does when its run had finished already (its graph call
    returned). ``"return"`` (the default) takes it as a retry: it returns the run's final
    state, runs nothing, and logs a warning naming the run and when it finished (new work
    under a reused run id would be dropped so). ``"raise"`` refuses it with
    :class:`~langgraph_deterministic.RunSupersededError`, for callers whose every call is
    new work (a chat turn per run id) and whose retries never follow a finished attempt.
    """
    if thread_id is None or (isinstance(thread_id, str) and not thread_id.strip()):
        raise ConfigurationError("run_config needs a thread_id (a non-empty str or a UUID).")
    if isinstance(run_id, uuid.UUID):
        run_id = str(run_id)
    if not isinstance(run_id, str) or not run_id.strip():
        raise RunIdRequiredError(
            f"run_config needs a run_id: a non-empty str or uuid.UUID that stays the same "
            f"across retries of this call, got {run_id!r}."
        )
    if multitask_strategy is not None:
        configurable[MULTITASK_KEY] = check_strategy(multitask_strategy)
    if on_finished not in ("return", "raise"):
        raise ConfigurationError(
            f"on_finished must be 'return' or 'raise', not {on_finished!r}."
        )
    if on_finished == "raise":
        configurable[ON_FINISHED_KEY] = on_finished
    return {
        "configurable": {
            "thread_id": str(thread_id),
            RUN_ID_KEY: run_id,
            **configurable,
        },
        "metadata": {RUN_ID_KEY: run_id},
        "callbacks": [RunInputRecorder()],
    }
