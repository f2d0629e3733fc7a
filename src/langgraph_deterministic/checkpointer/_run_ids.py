"""Run ids read from a config: ``metadata.run_id`` or ``configurable.run_id``, a
``uuid.UUID`` normalised to its string form, anything else refused."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_deterministic.checkpointer._keys import RUN_ID_KEY
from langgraph_deterministic.errors import RunIdRequiredError


def normalise_run_id(value: Any, where: str) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        if not value.strip():
            raise RunIdRequiredError(
                f"{where} is an empty string. Give every graph call a stable, non-empty "
                "run id: run_config(thread_id, run_id)."
            )
        return value
    raise RunIdRequiredError(
        f"{where} is a {type(value).__name__} ({value!r}); a run id must be a str or a "
        "uuid.UUID. LangGraph drops other types from checkpoint metadata, so retries "
        "would not be recognised. Pass run_config(thread_id, str(run_id))."
    )


def run_id_of(config: RunnableConfig) -> tuple[str | None, Any]:
    metadata = config.get("metadata") or {}
    configurable = config.get("configurable") or {}
    raw = metadata.get(RUN_ID_KEY)
    where = 'config["metadata"]["run_id"]'
    if raw is None:
        raw = configurable.get(RUN_ID_KEY)
        where = 'config["configurable"]["run_id"]'
    if raw is not None:
        run_id = normalise_run_id(raw, where)
        other = configurable.get(RUN_ID_KEY)
        # run_config puts the same str in both places: nothing more to check then
        if other is not None and other is not raw and (
            normalise_run_id(other, "configurable.run_id") != run_id
        ):
            raise RunIdRequiredError(
                f'config["metadata"]["run_id"] ({run_id!r}) and config["configurable"]'
                f'["run_id"] ({other!r}) differ; a graph call has one run id. Build the '
                "config with run_config(thread_id, run_id)."
            )
        return run_id, raw
    return None, None
