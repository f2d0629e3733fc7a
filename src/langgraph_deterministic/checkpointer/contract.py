"""The retry contract, as pure decisions: no I/O here.

The saver core (``_core``) asks this module three kinds of question and turns the
answers into SQL; the sync and async APIs share every answer.

* **What call is this?** :meth:`RunContract.call_info` reads a config: thread, namespace,
  the run id (``metadata.run_id`` / ``configurable.run_id``, a ``uuid.UUID`` normalised to
  its string form; the top-level ``config["run_id"]`` alone is refused, LangGraph never
  stores it), whether the call comes from a running graph, and the input fingerprint
  that :func:`~langgraph_deterministic.config.run_config` recorded.
* **May this graph run start?** :meth:`RunContract.decide_start` compares the call with
  the thread's head checkpoint and the run ledger, *before* LangGraph runs anything:
  proceed, hand back a finished run's final checkpoint, or raise
  ``RunIdRequiredError`` / ``RunInputMismatchError`` / ``RunSupersededError``.
* **Who may run on this thread now?** :class:`Admission` reads the verdict of
  ``lgd_admit_v3`` (the thread's lease, taken in the same round trip as the head read)
  and raises ``ThreadBusyError`` / ``RunUnfinishedError`` per the run's
  ``multitask_strategy``; :func:`unanswered_tool_calls` spots a thread stuck on a tool
  call that no lease or ledger row explains (a thread adopted from PostgresSaver).
* **What goes into a write?** :meth:`RunContract.stored_metadata` (no secrets by
  default) and :meth:`RunContract.guard_put` / :meth:`RunContract.guard_writes` (the
  parameters of the fencing statements that run in the write's own transaction).

Fencing itself needs the database's view of the thread at commit time, so the final
word belongs to Postgres: ``lgd_guard_put`` claims the one child slot of the parent
checkpoint (a unique key), so two attempts can never both extend the same checkpoint;
``lgd_guard_writes`` refuses pending writes to a checkpoint another attempt has already
moved past. :func:`translate_guard_error` maps their SQLSTATEs to our errors.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as _dt
import decimal
import enum
import hashlib
import json
import logging
import re
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    EXCLUDED_METADATA_KEYS,
    CheckpointMetadata,
    CheckpointTuple,
)

from langgraph_deterministic.errors import (
    ConcurrentRunError,
    ConfigurationError,
    DeterministicError,
    RunIdRequiredError,
    RunInputMismatchError,
    RunSupersededError,
    RunUnfinishedError,
    ThreadBusyError,
)

logger = logging.getLogger("langgraph_deterministic")

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
GRAPH_RUN_MARKER = "__pregel_runtime"
#: Configurable key of a per-call multitask strategy (set by run_config).
MULTITASK_KEY = "__lgd_multitask_strategy"
#: Configurable key ``get_tuple`` hands a graph run addressed at a past checkpoint: the
#: checkpoint it branches from on purpose (LangGraph copies it into the run's writes).
BRANCH_KEY = "__lgd_branch"
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
#: (see RunContract.call_info, carry_run_id).
CARRIED: contextvars.ContextVar[tuple[str, str, frozenset[str]] | None] = (
    contextvars.ContextVar("lgd_carried", default=None)
)
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
INTERRUPT = "__interrupt__"
TASKS = "__pregel_tasks"

#: Configurable keys copied into stored checkpoint metadata unless told otherwise.
#: LangGraph copies every str/int/float/bool configurable value (API keys included);
#: we copy only these. ``config["metadata"]`` (what you chose to attach) is still kept,
#: except keys whose names look like secrets.
DEFAULT_METADATA_KEYS: frozenset[str] = frozenset({"run_id", "assistant_id", "graph_id"})
# A metadata key is secret-looking when it contains one of these (so `apikey`, `x-api-key`,
# `AuthorizationHeader` and `bearer_token` are caught, at the price of a `monkey`)...
_SECRET_SUBSTRINGS = (
    "key", "token", "secret", "passw", "passphrase", "auth", "bearer", "credential",
    "cookie", "private", "signature", "jwt", "session",
)  # fmt: skip
# ...or has one of these short words as a word of its own (`db_pwd`, `userPass`, `creds`).
_SECRET_WORDS = frozenset({"pwd", "pw", "pass", "pin", "otp", "cred", "creds", "dsn", "sig"})
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
# A value that is a credential whatever its key: an Authorization header, a JWT, a URL or
# DSN carrying a password, or a well-known API key shape.
_SECRET_VALUE = re.compile(
    r"^\s*(bearer|basic|token|digest)\s+\S"
    r"|^eyJ[\w-]*\.[\w-]+\.[\w-]*$"
    r"|://[^/\s:@]*:[^/\s@]+@"
    r"|\bpassword\s*="
    r"|^(sk|rk|pk)[-_](live[-_]|test[-_]|proj[-_]|ant[-_])?[A-Za-z0-9_-]{16,}"
    r"|^(ghp|gho|ghs|ghu|github_pat|glpat|xox[abposr])[-_][A-Za-z0-9_-]{10,}"
    r"|^(AKIA|ASIA)[0-9A-Z]{16}$|^AIza[0-9A-Za-z_-]{30,}$",
    re.IGNORECASE,
)

# SQLSTATEs raised by the guard functions of migration 0004.
SQLSTATE_CHILD_TAKEN = "LG409"
SQLSTATE_STALE_WRITE = "LG410"
SQLSTATE_CLOCK_BEHIND = "LG411"
SQLSTATE_COMMAND_REPLAY = "LG412"
SQLSTATE_LEASED = "LG413"


def check_strategy(value: Any) -> MultitaskStrategy:
    if value not in STRATEGIES:
        raise ConfigurationError(
            f"multitask_strategy must be one of {', '.join(map(repr, STRATEGIES))}, not {value!r}."
        )
    return value  # type: ignore[no-any-return]


# --- input fingerprints -----------------------------------------------------------------


def _canonical(value: Any, depth: int = 0) -> Any:
    """A JSON-able form of ``value`` that is equal for equal inputs, whatever dict order,
    object identity or message ids LangGraph assigned in place."""
    if depth > 64:
        raise ValueError("input nested deeper than 64 levels")
    d = depth + 1
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"f": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"b": bytes(value).hex()}
    if isinstance(value, uuid.UUID):
        return {"u": str(value)}
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return {"t": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"d": str(value)}
    if isinstance(value, enum.Enum):
        return {"e": type(value).__qualname__, "v": _canonical(value.value, d)}
    if isinstance(value, Mapping):
        items = sorted(
            (
                (json.dumps(_canonical(k, d), sort_keys=True), _canonical(v, d))
                for k, v in value.items()
            ),
            key=lambda kv: kv[0],
        )
        return {"m": items}
    if isinstance(value, list | tuple):
        return [_canonical(v, d) for v in value]
    if isinstance(value, set | frozenset):
        return {"s": sorted(json.dumps(_canonical(v, d), sort_keys=True) for v in value)}
    # LangGraph objects and LangChain messages.
    from langchain_core.messages import BaseMessage
    from langgraph.types import Command, Send

    if isinstance(value, BaseMessage):
        # The id is left out: LangGraph gives input messages ids in place, so the same
        # message object passed again on a retry in one process would otherwise differ.
        dumped = value.model_dump()
        dumped.pop("id", None)
        return {"msg": type(value).__name__, "v": _canonical(dumped, d)}
    if isinstance(value, Command):
        return {
            "cmd": _canonical(
                {
                    "graph": value.graph,
                    "update": value.update,
                    "resume": value.resume,
                    "goto": value.goto,
                },
                d,
            )
        }
    if isinstance(value, Send):
        return {"send": value.node, "arg": _canonical(value.arg, d)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic v2
        return {"model": type(value).__qualname__, "v": _canonical(model_dump(), d)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dc": type(value).__qualname__, "v": _canonical(fields, d)}
    raise TypeError(f"cannot fingerprint a {type(value).__qualname__}")


def input_kind(value: Any) -> InputKind:
    from langgraph.types import Command

    if value is None:
        return "none"
    return "command" if isinstance(value, Command) else "input"


def input_fingerprint(value: Any) -> str:
    """``"<kind>:<sha256 prefix>"`` of a graph input; equal for equal inputs.

    ``kind`` is ``input``, ``command`` (a ``Command``: resume, update, goto) or ``none``.
    Raises ``TypeError`` for a value it cannot fingerprint (an arbitrary object).
    """
    canon = json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canon.encode("utf-8")).hexdigest()[:32]
    return f"{input_kind(value)}:{digest}"


def fingerprint_kind(fingerprint: str | None) -> InputKind | None:
    if not fingerprint:
        return None
    kind = fingerprint.split(":", 1)[0]
    return kind if kind in ("input", "command", "none") else None  # type: ignore[return-value]


class RunInputRecorder(BaseCallbackHandler):
    """Records the input of the graph call made with a ``run_config`` config.

    LangGraph reports the input to the root callback (``on_chain_start``) right before it
    loads the thread's checkpoint, in the same thread or task; the saver reads the
    fingerprint from this handler in that ``get_tuple`` and can refuse a mismatched or
    duplicated input before a single node runs. It stores nothing and sends nothing.
    """

    run_inline = True
    raise_error = False

    def __init__(self) -> None:
        super().__init__()
        self.fingerprint: str | None = None
        #: the lease this call's graph run was admitted with (set by the saver's core)
        self.held: HeldLease | None = None
        self._release: Callable[[str], Any] | None = None
        # The chain run of the call this config was built for: the first one reported to
        # this handler. LangChain hands a call's handlers on to the calls made inside it
        # (a graph invoked in a node of another), whose chains it reports here too.
        self._root: uuid.UUID | None = None

    @property
    def bound(self) -> bool:
        """Whether a lease's release is bound to this call already (a call inside it that
        found this handler, having none of its own, must not take its place)."""
        return self._release is not None

    def bind_release(
        self, release: Callable[[str], Any] | Callable[[str], Awaitable[Any]], *, is_async: bool
    ) -> None:
        """Have ``release("ok" | "error")`` called when the graph call returns or raises.

        LangGraph reports the root chain's end to its callbacks before ``invoke`` /
        ``ainvoke`` returns, so the thread is free by the time the caller sees the
        result. For an async run the hooks are coroutines (LangChain awaits them on the
        event loop); for a sync run, plain calls.
        """
        self._release = release
        if is_async:
            self.on_chain_end = self._aend  # type: ignore[method-assign,assignment]
            self.on_chain_error = self._aerror  # type: ignore[method-assign,assignment]
        else:
            self.on_chain_end = self._end  # type: ignore[method-assign]
            self.on_chain_error = self._error  # type: ignore[method-assign]

    def _take_release(self, run_id: uuid.UUID | None) -> Callable[[str], Any] | None:
        if run_id is None or run_id != self._root:
            return None
        self._root = None  # the call is over: a retry with this config is a call anew
        release, self._release = self._release, None
        self.held = None
        return release

    # Without a lease (bind_release replaces these): only the end of the call is noted.
    def on_chain_end(self, outputs: Any, *, run_id: uuid.UUID | None = None, **kw: Any) -> None:
        self._take_release(run_id)

    def on_chain_error(
        self, error: BaseException, *, run_id: uuid.UUID | None = None, **kw: Any
    ) -> None:
        self._take_release(run_id)

    def _end(self, outputs: Any, *, run_id: uuid.UUID | None = None, **kw: Any) -> None:
        if (release := self._take_release(run_id)) is not None:
            release("ok")

    def _error(
        self, error: BaseException, *, run_id: uuid.UUID | None = None, **kw: Any
    ) -> None:
        if (release := self._take_release(run_id)) is not None:
            release("error")

    async def _aend(self, outputs: Any, *, run_id: uuid.UUID | None = None, **kw: Any) -> None:
        if (release := self._take_release(run_id)) is not None:
            await release("ok")

    async def _aerror(
        self, error: BaseException, *, run_id: uuid.UUID | None = None, **kw: Any
    ) -> None:
        if (release := self._take_release(run_id)) is not None:
            await release("error")

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: uuid.UUID,
        parent_run_id: uuid.UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if self._root is not None:
            return
        self._root = run_id
        try:
            self.fingerprint = input_fingerprint(inputs)
        except (TypeError, ValueError) as exc:
            self.fingerprint = None
            logger.warning(
                "langgraph-deterministic cannot fingerprint this graph input (%s): a retry "
                "with a different input under the same run_id will not be detected.",
                exc,
            )

    def __deepcopy__(self, memo: dict[int, Any]) -> RunInputRecorder:
        return self  # configs get copied; the handler must stay the one LangGraph calls

    def __copy__(self) -> RunInputRecorder:
        return self


def find_recorder(config: RunnableConfig) -> RunInputRecorder | None:
    callbacks = config.get("callbacks")
    if not callbacks:
        return None
    if isinstance(callbacks, list | tuple):
        handlers: Iterable[Any] = callbacks
    else:
        handlers = [
            *getattr(callbacks, "handlers", ()),
            *getattr(callbacks, "inheritable_handlers", ()),
        ]
    recorders = [h for h in handlers if isinstance(h, RunInputRecorder)]
    if not recorders:
        return None
    # A graph called inside a node of another graph run sees the outer call's recorder
    # too: its own is the one whose chain this config's callbacks are the children of
    # (the one LangChain added last, failing that).
    parent = getattr(callbacks, "parent_run_id", None)
    if parent is not None:
        for recorder in recorders:
            if recorder._root == parent:
                return recorder
    return recorders[-1]


# --- what call is this? -------------------------------------------------------------


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

    @property
    def root(self) -> bool:
        return self.checkpoint_ns == ""


def _normalise_run_id(value: Any, where: str) -> str:
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


def _run_id_of(config: RunnableConfig) -> tuple[str | None, Any]:
    metadata = config.get("metadata") or {}
    configurable = config.get("configurable") or {}
    raw = metadata.get(RUN_ID_KEY)
    where = 'config["metadata"]["run_id"]'
    if raw is None:
        raw = configurable.get(RUN_ID_KEY)
        where = 'config["configurable"]["run_id"]'
    if raw is not None:
        run_id = _normalise_run_id(raw, where)
        other = configurable.get(RUN_ID_KEY)
        if other is not None and _normalise_run_id(other, "configurable.run_id") != run_id:
            raise RunIdRequiredError(
                f'config["metadata"]["run_id"] ({run_id!r}) and config["configurable"]'
                f'["run_id"] ({other!r}) differ; a graph call has one run id. Build the '
                "config with run_config(thread_id, run_id)."
            )
        return run_id, raw
    return None, None


class RunContract:
    """The run-id policy and metadata allow-list of one saver, and its decisions."""

    def __init__(
        self,
        policy: Policy = "require",
        metadata_keys: Iterable[str] | None = None,
        *,
        multitask_strategy: MultitaskStrategy = "reject",
        lease_ttl: float = 30.0,
        enqueue_timeout: float = 300.0,
    ) -> None:
        self.policy: Policy = policy
        self.multitask_strategy: MultitaskStrategy = check_strategy(multitask_strategy)
        self.lease_ttl = float(lease_ttl)
        self.enqueue_timeout = float(enqueue_timeout)
        self.metadata_keys: frozenset[str] = (
            DEFAULT_METADATA_KEYS if metadata_keys is None else frozenset(metadata_keys)
        )
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()

    @property
    def enforced(self) -> bool:
        return self.policy != "off"

    def call_info(self, config: RunnableConfig, thread_id: str, checkpoint_ns: str) -> CallInfo:
        configurable = config.get("configurable") or {}
        in_graph_run = GRAPH_RUN_MARKER in configurable
        if not self.enforced:
            run_id, raw = None, None
            with contextlib.suppress(RunIdRequiredError):
                run_id, raw = _run_id_of(config)
            return CallInfo(thread_id, checkpoint_ns, run_id, raw, in_graph_run, None, None,
                            bool(configurable.get("checkpoint_id")))  # fmt: skip
        run_id, raw = _run_id_of(config)
        if run_id is None and not in_graph_run:
            carried = CARRIED.get()
            if carried is not None and carried[0] == thread_id:
                if str(configurable.get("checkpoint_id") or "") in carried[2]:
                    run_id = raw = carried[1]
                else:  # another operation on the thread (e.g. an unaddressed update_state)
                    CARRIED.set(None)
        recorder = find_recorder(config)
        attempt = configurable.get(ATTEMPT_KEY)
        strategy = configurable.get(MULTITASK_KEY)
        branching = BRANCHING.get()
        inherited = (
            checkpoint_ns != ""
            and in_graph_run
            and branching is not None
            and branching[0] == thread_id
            and branching[1] == run_id
        )
        if inherited and attempt is None and branching is not None:
            # Without it, a branch's and the first run's first checkpoints of a namespace
            # (both loaded nothing) could not be told apart without run ids.
            attempt = branching[2]
        return CallInfo(
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            run_id=run_id,
            raw_run_id=raw,
            in_graph_run=in_graph_run,
            fingerprint=recorder.fingerprint if recorder is not None else None,
            attempt=str(attempt) if attempt is not None else None,
            addressed=bool(configurable.get("checkpoint_id")),
            recorded=recorder is not None,
            # The callbacks' run id: LangGraph neither compares nor stores it, so a retry
            # carrying only this id would re-apply its input (see require_run_id).
            tracing_id=config.get("run_id") if run_id is None else None,
            strategy=check_strategy(strategy) if strategy is not None else None,
            branch_from=configurable.get(BRANCH_KEY),
            inherited_branch=inherited,
            recorder=recorder,
        )

    # -- policy --------------------------------------------------------------------

    def require_run_id(self, info: CallInfo, what: str) -> None:
        """Raise or warn, per policy, when a write (or a graph run) has no run id."""
        if info.run_id is not None or not self.enforced:
            return
        if info.tracing_id is not None:
            message = (
                f'{what} on thread {info.thread_id!r} has only a top-level config["run_id"] '
                f"({info.tracing_id}), which is LangChain's tracing id: LangGraph never "
                "compares or stores it, so a retry would re-apply its input. Pass the run "
                "id as metadata.run_id: run_config(thread_id, run_id) does it (keep "
                "config['run_id'] for tracing if you like)."
            )
            if self.policy == "require":
                raise RunIdRequiredError(message + " Nothing was run or written.")
            self._warn_once(info.thread_id, message)
            return
        if self.policy == "require":
            raise RunIdRequiredError(
                f"{what} on thread {info.thread_id!r} carries no run id (metadata.run_id), "
                'and this saver has run_id_policy="require". Without one a retried call '
                "re-applies its input. Build the config with "
                "langgraph_deterministic.run_config(thread_id, run_id), using an id that "
                "stays the same across retries of one call (a workflow id, a task id, a "
                'business key). To adopt gradually, use run_id_policy="warn". Nothing was '
                "written."
            )
        with self._warned_lock:
            if info.thread_id in self._warned:
                return
            if len(self._warned) > 100_000:
                self._warned.clear()
            self._warned.add(info.thread_id)
        logger.warning(
            "langgraph-deterministic: %s on thread %r carries no run id; a retry of this "
            "call would re-apply its input. Use run_config(thread_id, run_id). (Logged "
            "once per thread; run_id_policy='warn'.)",
            what,
            info.thread_id,
        )

    # -- may this graph run start? ---------------------------------------------------

    def checks_start(self, info: CallInfo) -> bool:
        """Whether ``get_tuple`` for this call runs the start checks: the outer graph of a
        running graph loading its thread (its latest checkpoint, or one it addresses:
        time travel), not get_state."""
        return self.enforced and info.in_graph_run and info.root

    def strategy_of(self, info: CallInfo) -> MultitaskStrategy:
        return info.strategy or self.multitask_strategy

    def admission(self, info: CallInfo, attempt: str, ticket: int | None) -> dict[str, Any] | None:
        """Parameters of ``lgd_admit_v3`` for a graph run, or None when it takes no lease:
        without a run id the run cannot be told apart from another, and without
        run_config's recorder the saver would never hear that it returned."""
        if info.run_id is None or info.recorder is None:
            return None
        if info.recorder.bound:
            # Its call holds a lease already: a graph called inside a node of that run
            # with a config of its own but no run_config (it has only the outer call's
            # recorder), or LangGraph's second load of the same call (its superseded
            # probe after an addressed load).
            return None
        return {
            "thread_id": info.thread_id,
            "run_id": info.run_id,
            "attempt": attempt,
            "strategy": self.strategy_of(info),
            "ttl": self.lease_ttl,
            "ticket": ticket,
        }

    def refuse_busy(self, info: CallInfo, admission: Admission, waited: float | None) -> None:
        strategy = self.strategy_of(info)
        lease = admission.holder
        held = f"run {lease.run_id!r}" if lease else "another run"
        until = f" (lease until {lease.expires_at:%H:%M:%S} UTC)" if lease else ""
        if waited is not None:
            why = (
                f"Run {info.run_id!r} waited {waited:.1f} s in the queue of thread "
                f"{info.thread_id!r} (multitask_strategy='enqueue'), the saver's "
                f"enqueue_timeout, and {held} still holds the thread{until}."
            )
        else:
            why = (
                f"Thread {info.thread_id!r} is busy: {held} is running on it{until}, and run "
                f"{info.run_id!r} has multitask_strategy={strategy!r}."
            )
        raise ThreadBusyError(
            f"{why} Nothing was run or written. Retry later, or start the run with "
            "run_config(thread_id, run_id, multitask_strategy=...): 'enqueue' waits its "
            "turn, 'interrupt' stops the running run at its next write and continues from "
            "its latest checkpoint, 'rollback' stops it and removes what it wrote."
        )

    def refuse_unfinished(self, info: CallInfo, admission: Admission) -> None:
        lease = admission.holder
        prev = lease.run_id if lease else "?"
        how = (
            "raised an exception"
            if lease and lease.ended == "error"
            else "stopped without returning (its worker died; its lease expired)"
        )
        raise RunUnfinishedError(
            f"The previous run on thread {info.thread_id!r}, {prev!r}, {how} and was never "
            f"retried: the thread holds its half-done step (for an agent, possibly a tool call "
            f"without a result, which model providers reject). Run {info.run_id!r} would "
            "apply its input on top of it, so nothing was run or written. Either retry the "
            f"unfinished run with its run id (run_config({info.thread_id!r}, {prev!r}) and "
            "its original input: it resumes where it stopped), or start this run with "
            "run_config(..., multitask_strategy='rollback') to remove what the unfinished "
            "run wrote and continue from the checkpoint before it ('interrupt' continues on "
            "top of it instead). To find and fix threads damaged before: "
            "`langgraph-deterministic audit` / `langgraph-deterministic repair`."
        )

    def check_stuck_head(
        self, info: CallInfo, head: CheckpointTuple, kind: InputKind | None
    ) -> None:
        """A new input on a thread whose head is stuck on a tool call that nothing explains
        (no lease, no ledger row: a thread written before this saver, or by the peer):
        refused under "require", warned about under "warn"."""
        if kind != "input" or any(w[1] == INTERRUPT for w in head.pending_writes or ()):
            return
        calls = unanswered_tool_calls(head.checkpoint.get("channel_values") or {})
        if not calls:
            return
        message = (
            f"Thread {info.thread_id!r} is stuck on an unfinished step: its latest checkpoint "
            f"{head.config['configurable']['checkpoint_id']} has tool calls without a result "
            f"({', '.join(calls[:3])}), left by a run that never finished. Applying run "
            f"{info.run_id!r}'s input on top would make every later model call fail (providers "
            "reject unanswered tool calls). Run `langgraph-deterministic audit --thread "
            f"{info.thread_id}` to see the damage and `langgraph-deterministic repair` to fix "
            "it, or retry the unfinished run with its run id."
        )
        if self.policy == "require":
            raise RunUnfinishedError(message + " Nothing was run or written.")
        self._warn_once(info.thread_id, message)

    def decide_start(
        self,
        info: CallInfo,
        head_metadata: Mapping[str, Any] | None,
        ledger: LedgerRow | None,
    ) -> StartDecision:
        """Decide, before LangGraph applies any input or runs any node, what a graph run
        may do on this thread. Raises the contract's errors; writes nothing."""
        self.require_run_id(info, "A graph run")
        run_id = info.run_id
        if run_id is None:
            return StartDecision("proceed")
        if not info.recorded:
            self._require_recorder(info)
        if head_metadata is None:
            return StartDecision("proceed")
        head_run = head_metadata.get(RUN_ID_KEY)
        kind = fingerprint_kind(info.fingerprint)
        if head_run == run_id:
            stored = head_metadata.get(FINGERPRINT_KEY)
            self._check_same_input(info, stored if isinstance(stored, str) else None)
            if kind == "command":
                raise RunSupersededError(
                    f"Run {run_id!r} on thread {info.thread_id!r} was started by a Command "
                    "(resume/update/goto) that has already been applied: the thread's "
                    "latest checkpoint was written by this run after it. Delivering the "
                    "same Command again would answer a later interrupt or apply the update "
                    "twice, so nothing was run or written. If this is a redelivery, the "
                    "first delivery succeeded: read its result with graph.get_state(...) "
                    "or saver.get_run(thread_id, run_id). To answer a new interrupt, send a "
                    "new Command under a new run_id (or resume by interrupt id: "
                    "Command(resume={interrupt.id: value}))."
                )
            return StartDecision("proceed")
        if ledger is None:
            return StartDecision("proceed")
        # A run this thread has seen before, but the head is another run's: a late retry.
        self._check_same_input(info, ledger.input_fingerprint)
        if ledger.status == "done" and kind != "command" and ledger.last_checkpoint_id:
            return StartDecision("final", ledger.last_checkpoint_id)
        if ledger.status == "rolled_back":
            raise RunSupersededError(
                f"Run {run_id!r} on thread {info.thread_id!r} was rolled back by a later run "
                "(multitask_strategy='rollback'): its checkpoints were removed. Retrying it "
                "now would apply its input on top of the later run, so nothing was run or "
                "written. Start a new run (a new run_id) if its input still matters."
            )
        raise RunSupersededError(
            f"Run {run_id!r} was retried on thread {info.thread_id!r} after a later run "
            f"({head_run!r}) moved the thread on; run {run_id!r} had not finished "
            f"(status {ledger.status!r}). Re-running it now would apply its input on top of "
            "the later run's state, so nothing was run or written. Treat the run as "
            "abandoned, or start a new run (a new run_id) with the input it should apply "
            "now; saver.get_run(thread_id, run_id) shows what it had done."
        )

    def _warn_once(self, thread_id: str, message: str) -> None:
        with self._warned_lock:
            key = f"{thread_id}\x00{message[:40]}"
            if key in self._warned:
                return
            if len(self._warned) > 100_000:
                self._warned.clear()
            self._warned.add(key)
        logger.warning("langgraph-deterministic: %s (Logged once per thread.)", message)

    def _require_recorder(self, info: CallInfo) -> None:
        message = (
            f"The graph run {info.run_id!r} on thread {info.thread_id!r} has a run id but its "
            "config was not made by run_config(), so the saver cannot see its input: a "
            "retry with a different input, or a second delivery of the same Command(resume="
            "...), could not be refused before nodes run. Build the config with "
            "langgraph_deterministic.run_config(thread_id, run_id, **configurable) (to add "
            "callbacks, append to its 'callbacks' list instead of replacing it)."
        )
        if self.policy == "require":
            raise RunIdRequiredError(message + " Nothing was run or written.")
        self._warn_once(info.thread_id, message)

    def _check_same_input(self, info: CallInfo, stored: str | None) -> None:
        if info.fingerprint and stored and info.fingerprint != stored:
            raise RunInputMismatchError(
                f"Run {info.run_id!r} on thread {info.thread_id!r} was first called with a "
                f"different input ({stored}) than this call ({info.fingerprint}). A run id "
                "names one call with one input; reusing it for another input would silently "
                "drop the new input. Nothing was run or written. If this is new work, give it "
                "a new run_id; if it is a retry, pass exactly the original input."
            )

    # -- what goes into a write? -----------------------------------------------------

    def stored_metadata(
        self, config: RunnableConfig, metadata: CheckpointMetadata, info: CallInfo
    ) -> dict[str, Any]:
        """The metadata row of a checkpoint: LangGraph's own keys, the config's
        ``metadata`` (minus secret-looking names), allow-listed configurable keys, and the
        normalised run id and input fingerprint."""
        stored: dict[str, Any] = {
            k: v.replace("\u0000", "") if isinstance(v, str) else v
            for k, v in metadata.items()
            if k != "writes"
        }

        def copy(source: Mapping[str, Any] | None, allowed: frozenset[str] | None) -> None:
            for key, value in (source or {}).items():
                if key in stored or key in EXCLUDED_METADATA_KEYS or key.startswith("__"):
                    continue
                if allowed is not None and key not in allowed:
                    continue
                if key not in self.metadata_keys and _looks_secret(key, value):
                    continue
                if isinstance(value, str):
                    stored[key] = value.replace("\u0000", "")
                elif isinstance(value, bool | int | float):
                    stored[key] = value

        copy(config.get("metadata"), None)
        copy(config.get("configurable"), self.metadata_keys)
        if info.run_id is not None:
            stored[RUN_ID_KEY] = info.run_id
        if info.fingerprint is not None and info.root:
            stored.setdefault(FINGERPRINT_KEY, info.fingerprint)
        return stored

    def guard_put(
        self, info: CallInfo, parent_id: str | None, checkpoint_id: str
    ) -> tuple[Any, ...] | None:
        """Arguments of ``lgd_guard_put`` for this checkpoint write, or None (policy off)."""
        if not self.enforced:
            return None
        return (
            info.thread_id,
            info.checkpoint_ns,
            parent_id or "",
            checkpoint_id,
            info.run_id,
            info.attempt,
            info.root and info.run_id is not None,
            info.fingerprint,
            self.deliberate(info, parent_id),
        )

    def deliberate(self, info: CallInfo, parent_id: str | None) -> bool:
        """Whether a write continues ``parent_id`` on purpose, as a branch of its own when
        the parent was continued already: a graph run addressed at that past checkpoint,
        or a write outside any graph run that no attempt handed out (update_state at a past
        checkpoint, or ``as_node="__copy__"`` of a thread's first checkpoint: a second root,
        ``parent_id`` None). Writes of graph runs (zombies, race losers) stay fenced. A
        subgraph of a time-travelling run is a branch in its namespace: lgd_guard_put_v7
        lets it take its lineage slot where another run holds the parent's, never where its
        own run does."""
        if info.inherited_branch:
            return True
        if not info.in_graph_run and info.attempt is None:
            return True
        return parent_id is not None and info.branch_from == parent_id

    def chain_slot(self, info: CallInfo, checkpoint_id: str) -> str:
        """The child slot of ``checkpoint_id`` whose holder fences this writer's pending
        writes: a deliberate branch's own lineage slot at its branch point."""
        if info.branch_from == checkpoint_id:
            return f"{checkpoint_id}~{info.run_id or info.attempt}"
        return checkpoint_id

    def guard_writes(
        self, info: CallInfo, checkpoint_id: str, task_id: str, channels: Iterable[str]
    ) -> dict[str, Any] | None:
        """Parameters of ``lgd_guard_writes`` for pending writes, or None (policy off)."""
        if not self.enforced:
            return None
        channels = list(channels)
        return {
            "thread_id": info.thread_id,
            "checkpoint_ns": info.checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "slot": self.chain_slot(info, checkpoint_id),
            "attempt": info.attempt,
            "run_id": info.run_id,
            "command": info.root and task_id == NULL_TASK_ID and info.run_id is not None,
            "interrupted": info.root and info.run_id is not None and INTERRUPT in channels,
        }


def carry_run_id(info: CallInfo, *configs: RunnableConfig | None) -> None:
    """Remember the checkpoints a call outside a graph run with a run id handed out or
    stored (see CARRIED); a call of another run or thread starts afresh."""
    if info.in_graph_run or info.run_id is None:
        return
    ids = {str((c or {}).get("configurable", {}).get("checkpoint_id") or "") for c in configs}
    if None in configs:
        ids.add("")  # no parent: a copy of this first checkpoint has none either
    carried = CARRIED.get()
    if carried is not None and carried[:2] == (info.thread_id, info.run_id):
        ids |= carried[2]
    CARRIED.set((info.thread_id, info.run_id, frozenset(ids)))


def _looks_secret(key: str, value: Any = None) -> bool:
    """Whether a metadata entry may hold a credential, by its key or by its value. Errs
    on the side of dropping: a dropped entry is a missing filter, a kept one a leak."""
    lowered = key.casefold()
    if any(part in lowered for part in _SECRET_SUBSTRINGS):
        return True
    if any(word.casefold() in _SECRET_WORDS for word in _WORD.findall(key)):
        return True
    return isinstance(value, str) and _SECRET_VALUE.search(value) is not None


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One run of one thread, as the ledger (table ``lgd_runs``) holds it."""

    status: str
    last_checkpoint_id: str | None
    input_fingerprint: str | None


@dataclass(frozen=True, slots=True)
class Lease:
    """A thread's lease (table ``lgd_leases``): the run and attempt holding the thread."""

    run_id: str
    attempt: str
    strategy: str
    #: how the holder got the thread: ``free``, ``retry``, ``enqueued``,
    #: ``interrupted <run>``, ``rolled back <run>``, ``continued after unfinished <run>``
    outcome: str
    acquired_at: _dt.datetime
    expires_at: _dt.datetime
    #: None while held; ``ok`` / ``error`` once the graph call returned / raised
    ended: str | None

    def live(self, now: _dt.datetime) -> bool:
        return self.ended is None and self.expires_at > now


@dataclass(frozen=True, slots=True)
class HeldLease:
    """The lease a graph run was admitted with, to release when its call returns."""

    thread_id: str
    run_id: str
    attempt: str


@dataclass(frozen=True, slots=True)
class Admission:
    """The row ``lgd_admit_v3`` returns (see migration 0014)."""

    verdict: Literal["admitted", "busy", "queued", "unfinished"]
    ticket: int | None
    holder: Lease | None
    outcome: str | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Admission:
        (verdict, ticket, run, attempt, expires, ended, strategy, outcome, acquired,
         mine) = row  # fmt: skip
        holder = (
            Lease(run, attempt, strategy, outcome, acquired, expires, ended)
            if run is not None
            else None
        )
        return cls(verdict, ticket, holder, mine)


def unanswered_tool_calls(values: Mapping[str, Any]) -> list[str]:
    """Ids of the tool calls of the last AI message (in any channel holding a message
    list) that no later ToolMessage answers."""
    from langchain_core.messages import AIMessage, ToolMessage

    found: list[str] = []
    for value in values.values():
        if not isinstance(value, list) or not value:
            continue
        answered: set[str] = set()
        for message in reversed(value[-50:]):
            if isinstance(message, ToolMessage):
                answered.add(message.tool_call_id)
            elif isinstance(message, AIMessage):
                found += [
                    str(c.get("id")) for c in message.tool_calls if c.get("id") not in answered
                ]
                break
            elif not hasattr(message, "type"):
                break
    return found


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as the ledger knows it: ``saver.get_run(thread_id, run_id)``.

    ``status`` is ``running`` (its latest write; it may be finished, interrupted in a
    node, or crashed -- ``graph.get_state`` tells which), ``interrupted`` (stopped at an
    interrupt), ``done`` (a later run started after it had finished) or ``superseded`` (a
    later run moved the thread on before it finished). ``last_checkpoint`` is the
    checkpoint it wrote last: its final state once finished (for a ``running`` run, its
    newest root checkpoint at the time of the read). ``attempts`` counts the graph calls
    that wrote for it (retries included). ``rolled_back``: a later run started with
    ``multitask_strategy="rollback"`` removed its checkpoints.
    """

    thread_id: str
    run_id: str
    status: str
    attempts: int
    first_checkpoint_id: str
    last_checkpoint_id: str
    input_fingerprint: str | None
    superseded_by: str | None
    created_at: _dt.datetime
    updated_at: _dt.datetime
    last_checkpoint: CheckpointTuple | None
    #: the strategy the run was admitted under, and what that did (see Lease.outcome)
    multitask_strategy: str | None = None
    multitask_outcome: str | None = None
    #: the thread's lease while this run holds it (or held it last), else None
    lease: Lease | None = None

    @property
    def values(self) -> dict[str, Any]:
        """The channel values of the run's last checkpoint (its final state if finished)."""
        if self.last_checkpoint is None:
            return {}
        return dict(self.last_checkpoint.checkpoint["channel_values"])


@dataclass(frozen=True, slots=True)
class StartDecision:
    """``proceed``: load the head as usual. ``final``: the run finished earlier and a
    later run has moved the thread on; load its final checkpoint instead, so LangGraph
    resumes a finished run (runs nothing, writes nothing) and returns its final state."""

    action: Literal["proceed", "final"]
    checkpoint_id: str | None = None


def translate_guard_error(exc: BaseException, info: CallInfo) -> DeterministicError | None:
    """Our error for a failure of the guard statements, or None if it is something else."""
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    detail = getattr(diag, "message_detail", None) or ""
    run = f"run {info.run_id!r}" if info.run_id else "a call without run id"
    Run = run[0].upper() + run[1:]
    if sqlstate == SQLSTATE_CHILD_TAKEN:
        return ConcurrentRunError(
            f"Another attempt got to thread {info.thread_id!r} first ({detail}): the "
            f"checkpoint this attempt of {run} continues from has already been continued. "
            "This attempt is a zombie or lost a race with a retry or with another run; its "
            "checkpoint was not stored, so the thread's history stays linear and the other "
            "writer's state is kept. Stop this attempt: do not retry it blindly -- a retry "
            "with the same run_id resumes from what the winner stored. Make sure one call is "
            "executed by one worker at a time (a lease, Temporal's activity heartbeat)."
        )
    if sqlstate == SQLSTATE_STALE_WRITE:
        return ConcurrentRunError(
            f"Another attempt has moved thread {info.thread_id!r} past the checkpoint these "
            f"pending writes of {run} belong to ({detail}). They were not stored: this "
            "attempt is a zombie or lost a race. Stop it; a retry with the same run_id "
            "resumes from what the winner stored."
        )
    if sqlstate == SQLSTATE_LEASED:
        return ConcurrentRunError(
            f"{Run} was stopped on thread {info.thread_id!r}: another run took the thread over "
            f"({detail}) -- multitask_strategy 'interrupt' or 'rollback', or a run admitted "
            "after this attempt's lease expired. This write was not stored. Stop this "
            "attempt; the thread continues with the other run."
        )
    if sqlstate == SQLSTATE_CLOCK_BEHIND:
        return ConfigurationError(
            f"{Run} on thread {info.thread_id!r} wrote a checkpoint whose id sorts before "
            f"its parent's ({detail}). LangGraph loads a thread's greatest checkpoint id, so "
            "it would never be read again. Checkpoint ids carry the writer's clock: this "
            "machine's clock is behind the one that wrote the parent. Sync the clocks (NTP) "
            "and retry. Nothing was written."
        )
    if sqlstate == SQLSTATE_COMMAND_REPLAY:
        return RunSupersededError(
            f"{Run} on thread {info.thread_id!r} tried to apply a Command to a "
            "checkpoint the same run wrote after applying it once: a duplicate delivery of "
            "the same Command(resume/update/goto). It was refused so it cannot answer a "
            "later interrupt. Build configs with run_config(...) so duplicates are refused "
            "before anything runs; send a new answer under a new run_id."
        )
    return None
