"""LangGraph's own server (``langgraph dev``, langgraph-api) as a host: one line in
langgraph.json.

``"checkpointer": {"path": "langgraph_deterministic.server.checkpointer"}`` makes the
server keep its threads in Postgres with a :class:`ServerSaver`. The server invokes the
graph itself, with a config of its own, so this module does what ``run_config`` does
elsewhere:

* **the input is seen however the server invokes the graph**: a LangChain configure hook
  gives every root graph call in the server process a fresh ``RunInputRecorder`` (the
  callback ``run_config`` adds), so the saver fingerprints the input before a node runs;
* **the run id** is the server's own (``configurable.run_id``: the same on the server's
  retries of one run), or the client's idempotency key when the run's metadata carries
  one (``metadata={"idempotency_key": ...}``): a resend of one request under a fresh
  server run id is then a retry of the same run (input applied once, finished tasks not
  run again);
* **writes outside a graph run** (``POST /threads/{id}/state``, forks through the API)
  take the client's run id when the request names one (``"checkpoint": {"run_id": ...}``)
  and otherwise a run id minted for that one update (``update:<uuid>``): every write
  carries a run id, and an update is never mistaken for a retry of a run;
* **a run the server cancels** (``POST .../cancel``, the ``interrupt`` and ``rollback``
  multitask strategies) ends its lease as a run that returned: the server decided the
  thread's next run, and the saver lets it start (``rollback``: the server deletes the
  cancelled run's checkpoints through ``adelete_for_runs``). A run that raised, or whose
  server was killed, is continued by its resend under its idempotency key; a new run
  rolls it back first (the saver's ``multitask_strategy``, see :func:`checkpointer`).

See docs/how-to/langgraph-server.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tracers.context import register_configure_hook
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from langgraph_deterministic.checkpointer.contract import (
    CARRIED,
    GRAPH_RUN_MARKER,
    RUN_ID_KEY,
    RunInputRecorder,
    find_recorder,
)
from langgraph_deterministic.checkpointer.saver import DeterministicSaver
from langgraph_deterministic.errors import ConfigurationError

__all__ = [
    "DSN_ENV_VARS",
    "IDEMPOTENCY_KEY",
    "ServerSaver",
    "checkpointer",
    "install_input_recorder",
]

logger = logging.getLogger("langgraph_deterministic")

#: Where :func:`checkpointer` reads the database's DSN, first set wins: langgraph-api's
#: own names (``langgraph dev`` sets ``DATABASE_URI=:memory:`` for its in-memory edition,
#: which is skipped: use ``POSTGRES_URI`` there), then this project's.
DSN_ENV_VARS = ("DATABASE_URI", "POSTGRES_URI", "DATABASE_URL")
#: The key of a run's metadata that names the request: the run id of the saver's contract.
IDEMPOTENCY_KEY = "idempotency_key"
#: Set by :func:`install_input_recorder` in the server process: LangChain's configure hook
#: creates a fresh recorder for each root call only while this is set.
RECORDER_ENV = "LGD_RECORD_GRAPH_INPUTS"
#: The metadata key under which a checkpoint written under an idempotency key keeps the
#: run id the server gave the request that wrote it.
SERVER_RUN_KEY = "server_run_id"
_UPDATE_PREFIX = "update:"

_hook_lock = threading.Lock()
_hook_installed = False
#: Never set: the hook creates its handler from the class (a fresh one per root call).
_NO_SHARED_RECORDER: contextvars.ContextVar[ServerRecorder | None] = contextvars.ContextVar(
    "lgd_server_recorder", default=None
)
_migrated: set[str] = set()
#: The recorder of the root call in flight in this context (see ServerRecorder).
_ACTIVE: contextvars.ContextVar[ServerRecorder | None] = contextvars.ContextVar(
    "lgd_server_active_recorder", default=None
)


class ServerRecorder(RunInputRecorder):
    """The input recorder of a graph run the server makes. LangGraph hands the root
    graph's saver calls no callbacks, so the recorder of the root call in flight is
    found in :data:`_ACTIVE` (set in the graph call's own context by ``on_chain_start``,
    which LangChain runs inline for this handler). A run the server cancels
    (``asyncio.CancelledError`` through the graph call) ends its lease as one that
    returned: the server has decided what runs next on the thread."""

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: uuid.UUID,
        parent_run_id: uuid.UUID | None = None,
        **kwargs: Any,
    ) -> None:
        first = self._root is None
        super().on_chain_start(
            serialized, inputs, run_id=run_id, parent_run_id=parent_run_id, **kwargs
        )
        if first:
            _ACTIVE.set(self)

    def _failed(self, error: BaseException) -> str:
        if isinstance(error, asyncio.CancelledError):
            return "ok"
        return super()._failed(error)


class _AnyRecorder(type):
    """LangChain's configure hook adds its handler to a root call unless one is an
    instance of the hook's class: any RunInputRecorder (run_config's) counts."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, RunInputRecorder)


class _HookRecorder(ServerRecorder, metaclass=_AnyRecorder):
    """What the configure hook creates (only the hook checks instances of it)."""


def install_input_recorder() -> None:
    """Give every root LangChain call of this process a fresh :class:`ServerRecorder`
    (idempotent). A call that has a recorder already (``run_config``'s) gets none."""
    global _hook_installed
    with _hook_lock:
        if not _hook_installed:
            register_configure_hook(
                _NO_SHARED_RECORDER, True, handle_class=_HookRecorder, env_var=RECORDER_ENV
            )
            _hook_installed = True
        os.environ[RECORDER_ENV] = "1"


def _idempotency_key(metadata: Mapping[str, Any]) -> str | None:
    key = metadata.get(IDEMPOTENCY_KEY)
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise ConfigurationError(
            f"The run's metadata {IDEMPOTENCY_KEY!r} is {key!r}: it must be a non-empty "
            "string naming the request (the same on every resend of it). Nothing was run "
            "or written."
        )
    return key


class ServerSaver(DeterministicSaver):
    """:class:`DeterministicSaver` for the configs LangGraph's server builds: the run id
    is the client's idempotency key (``metadata.idempotency_key``) when the run carries
    one, else the server's; a write outside a graph run without a run id gets one minted
    for it (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the recorder of each root graph run in flight, by thread and server run id
        self._recorders: weakref.WeakValueDictionary[tuple[str, str], RunInputRecorder] = (
            weakref.WeakValueDictionary()
        )

    def _server_config(self, config: RunnableConfig) -> tuple[RunnableConfig, Any]:
        """The config the contract reads, and the run id LangGraph compares for this
        call (``config.metadata.run_id``: what a loaded checkpoint must show it)."""
        configurable = config.get("configurable") or {}
        metadata = config.get("metadata") or {}
        if GRAPH_RUN_MARKER in configurable:
            if find_recorder(config) is None:
                recorder = self._recorders.get(_run_key(configurable))
                if recorder is None:
                    recorder = _ACTIVE.get()
                if recorder is not None:
                    config = {**config, "callbacks": [recorder]}
            key = _idempotency_key(metadata)
            if key is None:
                return config, None
            server_run = configurable.get(RUN_ID_KEY) or metadata.get(RUN_ID_KEY)
            rewritten: RunnableConfig = {
                **config,
                "configurable": {**configurable, RUN_ID_KEY: key},
                "metadata": {**metadata, RUN_ID_KEY: key, SERVER_RUN_KEY: server_run},
            }
            return rewritten, metadata.get(RUN_ID_KEY, _MISSING)
        if configurable.get(RUN_ID_KEY) is not None or metadata.get(RUN_ID_KEY) is not None:
            return config, None
        # A write outside a graph run that names no run id: part of the update whose
        # earlier call carried one (update_state passes the returned config on), or a
        # new update.
        carried = CARRIED.get()
        thread = str(configurable.get("thread_id") or "")
        checkpoint_id = str(configurable.get("checkpoint_id") or "")
        if carried is not None and carried[0] == thread and checkpoint_id in carried[2]:
            return config, None
        minted = f"{_UPDATE_PREFIX}{uuid.uuid4()}"
        return {**config, "configurable": {**configurable, RUN_ID_KEY: minted}}, None

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if GRAPH_RUN_MARKER not in (config.get("configurable") or {}):
            return await super().aget_tuple(config)  # a read: no run id needed
        rewritten, compared = self._server_config(config)
        found = await super().aget_tuple(rewritten)
        recorder = find_recorder(rewritten)
        if (
            recorder is not None
            and (config.get("configurable") or {}).get("checkpoint_ns", "") == ""
        ):
            # The run's later writes come from other tasks (each step of the server's
            # stream runs in a copy of its context, without _ACTIVE): they find the
            # recorder by their thread and server run id (one run in flight per thread).
            self._recorders[_run_key(config["configurable"])] = recorder
        if found is None or compared is None:
            return found
        key = rewritten["configurable"][RUN_ID_KEY]
        if found.metadata.get(RUN_ID_KEY) != key:
            return found
        # LangGraph treats the call as the continuation of the head's run when the
        # head's metadata.run_id equals the config's: show it the id it compares.
        shown: dict[str, Any] = dict(found.metadata)
        shown[RUN_ID_KEY] = None if compared is _MISSING else compared
        return found._replace(metadata=shown)  # type: ignore[arg-type]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        rewritten, _ = self._server_config(config)
        return await super().aput(rewritten, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        rewritten, _ = self._server_config(config)
        await super().aput_writes(rewritten, writes, task_id, task_path)


_MISSING = object()


def _run_key(configurable: Mapping[str, Any]) -> tuple[str, str]:
    return str(configurable.get("thread_id")), str(configurable.get(RUN_ID_KEY))


def _dsn() -> str:
    for name in DSN_ENV_VARS:
        value = os.environ.get(name)
        # langgraph dev's in-memory edition sets DATABASE_URI=":memory:" for itself
        if value and value.strip() and value.strip() != ":memory:":
            return value.strip()
    raise ConfigurationError(
        "langgraph_deterministic.server.checkpointer found no database: set "
        f"{' or '.join(DSN_ENV_VARS)} to a Postgres DSN in the server's environment "
        "(langgraph dev: POSTGRES_URI, in the shell or in the .env file langgraph.json's "
        '"env" names). Nothing was run or written.'
    )


def _number(name: str, default: str, kind: type[int] | type[float]) -> float:
    value = os.environ.get(name, default)
    try:
        return kind(value)
    except ValueError:
        raise ConfigurationError(
            f"{name}={value!r} is not a number ({kind.__name__}); unset it for the default "
            f"{default}. Nothing was run or written."
        ) from None


@contextlib.asynccontextmanager
async def checkpointer() -> AsyncIterator[ServerSaver]:
    """The checkpointer of langgraph.json: ``{"checkpointer": {"path":
    "langgraph_deterministic.server.checkpointer"}}``.

    Reads the DSN from :data:`DSN_ENV_VARS`, applies this package's migrations once per
    process (under their advisory lock: many server processes may start at once), and
    yields a :class:`ServerSaver` on a pool. Settings from the environment:
    ``LGD_POOL_MAX_SIZE`` (default 20: the server runs ``N_JOBS_PER_WORKER`` runs at
    once, and reads beside them), ``LGD_LEASE_TTL`` (seconds a killed server keeps a
    thread busy, default 30), ``LGD_RUN_ID_POLICY`` (default ``require``),
    ``LGD_MULTITASK_STRATEGY`` (default ``rollback``: see below).

    The saver's multitask strategy decides only what the server's queue leaves to it: a
    run that starts on a thread whose previous run stopped unfinished (it raised, or its
    server was killed) and that is not that run's resend. Under ``rollback`` the new run
    removes what the unfinished one wrote and starts from the checkpoint before it (no
    half-done tool call under the new input; the unfinished run's resend is refused
    afterwards). ``reject`` refuses the new run until the unfinished one is resent under
    its idempotency key, which a run started without a key can never be.
    """
    dsn = _dsn()
    install_input_recorder()
    saver = ServerSaver(
        dsn,
        pool_max_size=int(_number("LGD_POOL_MAX_SIZE", "20", int)),
        lease_ttl=_number("LGD_LEASE_TTL", "30", float),
        run_id_policy=os.environ.get("LGD_RUN_ID_POLICY", "require"),
        multitask_strategy=os.environ.get("LGD_MULTITASK_STRATEGY", "rollback"),
    )
    async with saver:
        if dsn not in _migrated:
            applied = await saver.asetup()
            _migrated.add(dsn)
            if applied:
                logger.info("langgraph-deterministic applied migrations %s", applied)
        yield saver
