"""pytest plugin (``-p lgd_swap``): run LangGraph's own tests with DeterministicSaver in
place of PostgresSaver / AsyncPostgresSaver, without editing a line of their files.

Driven by ``run.py`` through environment variables:

``LGD_SUITE_SAVER``    ``theirs`` (baseline, nothing swapped) or ``ours``
``LGD_SUITE_POLICY``   our ``run_id_policy`` when swapped (``off``, ``warn`` or ``require``)
``LGD_SUITE_RUN_IDS``  ``1``: every root graph call and ``update_state`` without a run id
                       gets one, through ``run_config`` as a user would build it: a new
                       id per call, but a retry (no input / a resume, after a run that
                       raised) is called with that run's id and input; see ``_with_run_id``
``LGD_SUITE_BASE_URI`` ``postgresql://user[:pw]@host:port/`` - their fixtures append a
                       database name to it, as they do to their own default URI
``LGD_SUITE_DB``       scratch database standing in for their ``postgres`` database
``LGD_SUITE_KIND``     ``langgraph`` or ``checkpoint-postgres`` (which items to keep)
``LGD_SUITE_RESULTS``  JSON file this plugin writes: nodeid -> outcome and message
                       (rewritten every 50 tests, so a run cut short still counts)
``LGD_SUITE_ONLY``     optional: a comma list of the six fixtures to keep
``LGD_SUITE_SERDE``    ``peer`` (default: the peer's ``JsonPlusSerializer()`` where a test
                       passes none) or ``safe`` (our default, ``SafeSerializer``)

After collection the plugin keeps only the Postgres items (see ``_keep``), points their
URI constants at our server, and - with ``ours`` - replaces the saver classes in their
test modules by the two factories below. The factories build the connection exactly as
the peer's ``from_conn_string`` does (``autocommit=True, prepare_threshold=0,
row_factory=dict_row``) and hand it, or the pool their fixture built, to
``DeterministicSaver`` unchanged. What the factories add is only what their fixtures and
helpers touch on the peer object: ``.conn`` and ``.pipe`` attributes, ``await
saver.setup()`` on an async saver (ours is ``asetup()``), ``isinstance(saver,
AsyncPostgresSaver)`` for a saver they built as async, and ``saver._cursor()`` (a raw
dict-row cursor their prune tests read rows with).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

SIX = {
    "postgres",
    "postgres_pipe",
    "postgres_pool",
    "postgres_aio",
    "postgres_aio_pipe",
    "postgres_aio_pool",
}
CHECKPOINT_FILES = {
    "test_sync.py",
    "test_async.py",
    "test_prune.py",
    "test_delta_pagination.py",
    "test_delta_plain_value_seed.py",
    "test_conformance_delta.py",
}
_PEER_KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0}


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def _keep(item: pytest.Item) -> bool:
    if _env("LGD_SUITE_KIND") == "checkpoint-postgres":
        # The checkpointer tests (not the store's); ShallowPostgresSaver has no
        # counterpart of ours, so its items would compare the peer with itself.
        if item.path.name not in CHECKPOINT_FILES:
            return False
        params = getattr(getattr(item, "callspec", None), "params", {})
        return "shallow" not in params.values()
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("cache") == "redis":
        return False  # needs a Redis server, which neither side gets here
    only = set(filter(None, _env("LGD_SUITE_ONLY").split(","))) or SIX
    return any(params.get(name) in only for name in ("sync_checkpointer", "async_checkpointer"))


# --- the swap -----------------------------------------------------------------------


def _make(conn: Any, api: str, pipe: Any = None, serde: Any = None) -> Any:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_deterministic import DeterministicSaver

    if serde is None and _env("LGD_SUITE_SERDE", "peer") == "peer":
        # The peer's default, so the oracle compares the savers, not their serializers:
        # LangGraph's tests store their own classes, which our allow-list refuses on purpose.
        serde = JsonPlusSerializer()
    saver = DeterministicSaver(conn, run_id_policy=_env("LGD_SUITE_POLICY", "off"), serde=serde)  # type: ignore[arg-type]
    saver.conn = conn  # type: ignore[attr-defined]
    saver.pipe = pipe  # type: ignore[attr-defined]
    saver._lgd_suite_api = api  # type: ignore[attr-defined]
    if api == "async":
        saver.setup = saver.asetup  # type: ignore[method-assign]
        saver._cursor = _async_cursor(saver)  # type: ignore[attr-defined]
    else:
        saver._cursor = _sync_cursor(saver)  # type: ignore[attr-defined]
    return saver


def _sync_cursor(saver: Any) -> Any:
    from psycopg.rows import dict_row

    @contextmanager
    def cursor(**_: Any) -> Iterator[Any]:
        with saver._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            yield cur

    return cursor


def _async_cursor(saver: Any) -> Any:
    from psycopg.rows import dict_row

    @asynccontextmanager
    async def cursor(**_: Any) -> AsyncIterator[Any]:
        async with saver._aconnection() as conn, conn.cursor(row_factory=dict_row) as cur:
            yield cur

    return cursor


class _SwapMeta(type):
    """``isinstance(saver, PostgresSaver / AsyncPostgresSaver)`` for our savers, by the
    API the fixture built them for."""

    _api: str

    def __instancecheck__(cls, obj: object) -> bool:
        return getattr(obj, "_lgd_suite_api", None) == cls._api


class OursSync(metaclass=_SwapMeta):
    _api = "sync"

    def __new__(cls, conn: Any, pipe: Any = None, serde: Any = None) -> Any:  # type: ignore[misc]
        return _make(conn, "sync", pipe, serde)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, *, pipeline: bool = False, serde: Any = None
    ) -> Iterator[Any]:
        from psycopg import Connection
        from psycopg.rows import dict_row

        with Connection.connect(conn_string, **_PEER_KWARGS, row_factory=dict_row) as conn:
            if pipeline:
                with conn.pipeline() as pipe:
                    yield _make(conn, "sync", pipe, serde)
            else:
                yield _make(conn, "sync", None, serde)


class OursAsync(metaclass=_SwapMeta):
    _api = "async"

    def __new__(cls, conn: Any, pipe: Any = None, serde: Any = None) -> Any:  # type: ignore[misc]
        return _make(conn, "async", pipe, serde)

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, *, pipeline: bool = False, serde: Any = None
    ) -> AsyncIterator[Any]:
        from psycopg import AsyncConnection
        from psycopg.rows import dict_row

        async with await AsyncConnection.connect(
            conn_string, **_PEER_KWARGS, row_factory=dict_row
        ) as conn:
            if pipeline:
                async with conn.pipeline() as pipe:
                    yield _make(conn, "async", pipe, serde)
            else:
                yield _make(conn, "async", None, serde)


def _patch_modules() -> list[str]:
    base = _env("LGD_SUITE_BASE_URI")
    scratch = base + _env("LGD_SUITE_DB", "postgres")
    ours = _env("LGD_SUITE_SAVER") == "ours"
    patched = []
    for name, module in list(sys.modules.items()):
        if not (name == "tests" or name.startswith("tests.")) or module is None:
            continue
        for attr, value in (("DEFAULT_POSTGRES_URI", base), ("DEFAULT_URI", scratch)):
            if isinstance(getattr(module, attr, None), str) and base:
                setattr(module, attr, value)
        if ours:
            for attr, shim in (("PostgresSaver", OursSync), ("AsyncPostgresSaver", OursAsync)):
                if hasattr(module, attr):
                    setattr(module, attr, shim)
                    patched.append(f"{name}.{attr}")
    return patched


# --- run ids, as a user under run_id_policy="require" gives them ----------------------

# The last root run per (saver, thread) in this test: its run id, the checkpoint_id its
# config named, whether it ended normally (returned, or stopped at an interrupt), and the
# input it was first called with. Cleared before every test, so an id() reused by a later
# saver never matches.
_last_runs: dict[tuple[int, str], tuple[str, Any, bool, Any]] = {}


def _is_retry(input: Any, original: Any) -> bool:
    """What a user sends to retry a run: no input (LangGraph's "continue from where it
    stopped"), or the very input the run was first called with (a re-sent
    ``Command(resume=...)`` included). Another value - a corrected resume after one was
    rejected, say - is new work."""
    if input is None:
        return True
    try:
        return bool(input == original)
    except Exception:  # an input whose == refuses to compare: not the same call
        return False


def _with_run_id(graph: Any, input: Any, config: Any) -> tuple[Any, Any, Any]:
    """``config`` as ``run_config(thread_id, run_id, **configurable)`` builds it, its other
    keys kept, the input to call with, and the (saver, thread) key to record the run's
    outcome under. When this call retries the previous run on this thread (``_is_retry``,
    the same ``checkpoint_id``, and that run raised or was left unfinished) it is
    called as our contract tells a user to retry: that run's id and its original input
    (the same id with another input is ``RunInputMismatchError``); else a new id and the
    input unchanged. Unchanged (key ``None``) for a call inside a running graph (a
    subgraph, a task), a config that names a run id already, or one without a thread."""
    import secrets

    from langchain_core.callbacks import BaseCallbackManager
    from langchain_core.runnables.config import ensure_config

    from langgraph_deterministic import run_config

    merged = ensure_config(config)
    configurable = dict(merged.get("configurable") or {})
    metadata = dict(merged.get("metadata") or {})
    if (
        "__pregel_runtime" in configurable
        or "thread_id" not in configurable
        or configurable.get("run_id") is not None
        or metadata.get("run_id") is not None
    ):
        return config, input, None
    thread = configurable.pop("thread_id")
    saver = configurable.get("__pregel_checkpointer") or getattr(graph, "checkpointer", None)
    key = (id(saver), str(thread))
    previous = _last_runs.get(key)
    checkpoint_id = configurable.get("checkpoint_id")
    if (
        previous is not None
        and not previous[2]
        and previous[1] == checkpoint_id
        and _is_retry(input, previous[3])
    ):
        run_id, input = previous[0], previous[3]
    else:
        # Not uuid4: their tests patch it to make ids deterministic.
        run_id = f"suite-{secrets.token_hex(8)}"
    _last_runs[key] = (run_id, checkpoint_id, False, input)  # unfinished until it ends
    built = run_config(thread, run_id, **configurable)
    out = {**(config or {}), "configurable": built["configurable"]}
    out["metadata"] = {**metadata, **built["metadata"]}
    callbacks = (config or {}).get("callbacks")
    if callbacks is None:
        out["callbacks"] = built["callbacks"]
    elif isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        for handler in built["callbacks"]:
            manager.add_handler(handler, inherit=True)
        out["callbacks"] = manager
    else:
        out["callbacks"] = [*callbacks, *built["callbacks"]]
    return out, input, key


def _ended(key: Any) -> None:
    """The run recorded under ``key`` ended normally: a later call starts a new run."""
    if key in _last_runs:
        run_id, checkpoint_id, _, input = _last_runs[key]
        _last_runs[key] = (run_id, checkpoint_id, True, input)


def _tracked(stream: Iterator[Any], key: Any) -> Iterator[Any]:
    # An exception, or a stream closed early, leaves the run unfinished: retried by id.
    yield from stream
    _ended(key)


async def _atracked(stream: AsyncGenerator[Any, None], key: Any) -> AsyncIterator[Any]:
    try:
        async for chunk in stream:
            yield chunk
    finally:
        await stream.aclose()
    _ended(key)


def _give_run_ids() -> None:
    """Wrap the entry points a user calls with a config: ``stream``/``astream`` (``invoke``
    and ``ainvoke`` go through them) and ``bulk_update_state``/``abulk_update_state``
    (``update_state`` goes through them; always a new id, and it ends any run before it:
    the thread's head is then the update's). ``get_state``/history need no run id."""
    from langgraph.pregel import Pregel

    def update(name: str) -> None:  # (self, config, supersteps)
        original = getattr(Pregel, name)

        def wrapper(self: Any, config: Any, *args: Any, **kw: Any) -> Any:
            config, _, key = _with_run_id(self, _UPDATE, config)
            _ended(key)
            return original(self, config, *args, **kw)

        setattr(Pregel, name, wrapper)

    def stream(name: str, track: Any) -> None:  # (self, input, config=None, ...)
        original = getattr(Pregel, name)

        def wrapper(self: Any, input: Any, config: Any = None, *args: Any, **kw: Any) -> Any:
            config, input, key = _with_run_id(self, input, config)
            out = original(self, input, config, *args, **kw)
            return out if key is None else track(out, key)

        setattr(Pregel, name, wrapper)

    stream("stream", _tracked)
    stream("astream", _atracked)  # an async generator function: wrapped as one
    update("bulk_update_state")
    update("abulk_update_state")  # a coroutine function: the wrapper returns its coroutine


_UPDATE = object()  # the "input" of an update_state call: never a retry


# --- hooks --------------------------------------------------------------------------

_results: dict[str, dict[str, str]] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [i for i in items if _keep(i)]
    dropped = [i for i in items if not _keep(i)]
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)
    patched = _patch_modules()
    if _env("LGD_SUITE_RUN_IDS") == "1":
        _give_run_ids()
    if _env("LGD_SUITE_SAVER") == "ours" and not patched:
        raise pytest.UsageError("lgd_swap: found no PostgresSaver to swap in tests.*")


def pytest_runtest_setup(item: pytest.Item) -> None:
    _last_runs.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        crash = getattr(report.longrepr, "reprcrash", None)
        message = getattr(crash, "message", None) or str(report.longrepr).strip().splitlines()[-1]
        if not entry["message"]:
            entry["message"] = f"[{report.when}] {message}"[:2000]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        entry["message"] = str(getattr(report, "longrepr", ""))[:500]


def pytest_runtest_logfinish(nodeid: str) -> None:
    if len(_results) % 50 == 0:
        _write()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write()


def _write() -> None:
    path = _env("LGD_SUITE_RESULTS")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(_results, fh, indent=1, sort_keys=True)
