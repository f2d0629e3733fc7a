"""The restate-sdk names RestateJournal relies on, public and private, in one place.

Imported only when the restate extra is used (a ``RestateJournal`` is built); checked once
then. A restate-sdk upgrade that moves one raises
:class:`~langgraph_deterministic.errors.IncompatibleRestateError` here, naming the
supported versions.

What each is for:

* ``_restate_context_var`` (``restate.server_context``): the variable behind
  ``restate_context()``; while a run is active it holds our routed context.
* ``ServerInvocationContext``: the handler's context. The routed context subclasses it
  (built with ``object.__new__``, its state read from the real one); the driver calls its
  unbound ``run_typed`` / ``sleep`` and its instance's ``vm`` / ``receive`` /
  ``run_coros_to_execute`` / ``tasks`` / ``take_and_send_output`` (``CONTEXT_ATTRIBUTES``).
* ``ServerDurableFuture``: subclassed for routed ops, so ``restate.gather`` accepts them;
  it reaches our shim through ``future.context.vm.is_completed`` and
  ``context.create_poll_or_cancel_coroutine`` (``SHIM_METHODS``).
* ``restate.vm``: the progress loop's results and the unresolved-future combinators
  (the same loop ``restate.wait_completed`` runs); the VM's ``do_progress``,
  ``notify_input``, ``notify_input_closed``, ``is_replaying`` (``VM_METHODS``).
* ``DisconnectedException``, ``SdkInternalBaseException``, ``SdkInternalException``,
  ``SuspendedException``, ``TerminalError``: what the driver raises or lets through.
"""

from __future__ import annotations

from langgraph_deterministic._compat import incompatible_message, supported
from langgraph_deterministic.errors import IncompatibleRestateError

#: The restate-sdk versions RestateJournal supports (pyproject's restate extra).
SUPPORTED_RESTATE = supported("restate-sdk", ">=1.3,<1.4")


def incompatible(what: str) -> IncompatibleRestateError:
    return IncompatibleRestateError(
        incompatible_message("restate-sdk", what, SUPPORTED_RESTATE, user="RestateJournal")
    )


try:
    import restate  # noqa: F401  (the package itself: a clear error when it is missing)
except ImportError as exc:
    raise IncompatibleRestateError(
        "RestateJournal needs restate-sdk, which is not installed. "
        "Fix: pip install 'langgraph-deterministic[restate]'."
    ) from exc

try:
    from restate import RunOptions
    from restate.exceptions import (
        SdkInternalBaseException,
        SdkInternalException,
        SuspendedException,
        TerminalError,
    )
    from restate.serde import DefaultSerde
    from restate.server_context import (
        DisconnectedException,
        ServerDurableFuture,
        ServerInvocationContext,
        _restate_context_var,
    )
    from restate.vm import (
        AllCompletedUnresolvedFuture,
        DoProgressAnyCompleted,
        DoProgressCancelSignalReceived,
        DoProgressExecuteRun,
        FirstCompletedUnresolvedFuture,
        SingleUnresolvedFuture,
        Suspended,
        VMWrapper,
    )
except ImportError as exc:
    raise incompatible(f"lacks a name ({exc})") from exc

#: Instance attributes of a handler's ServerInvocationContext the driver uses (checked
#: per context, at RestateJournal(ctx): they are set in its __init__).
CONTEXT_ATTRIBUTES = ("vm", "receive", "run_coros_to_execute", "tasks", "take_and_send_output")
#: What restate's combinators call on ``future.context`` (the routed futures' shim).
SHIM_METHODS = ("create_poll_or_cancel_coroutine",)
VM_METHODS = ("do_progress", "notify_input", "notify_input_closed", "is_replaying", "is_completed")

_missing = [
    f"ServerInvocationContext.{m}"
    for m in ("run_typed", "sleep", "run", *SHIM_METHODS)
    if not callable(getattr(ServerInvocationContext, m, None))
]
_missing += [f"VMWrapper.{m}" for m in VM_METHODS if not callable(getattr(VMWrapper, m, None))]
if "children" not in getattr(AllCompletedUnresolvedFuture, "__dataclass_fields__", {}):
    _missing.append("AllCompletedUnresolvedFuture.children")
if _missing:
    raise incompatible(f"lacks {_missing}")


def check_context(ctx: object) -> None:
    """Refuse what is not a handler's context, or one without the attributes we use."""
    if missing := [a for a in CONTEXT_ATTRIBUTES if not hasattr(ctx, a)]:
        raise incompatible(f"has a ServerInvocationContext without {missing}")


__all__ = [
    "CONTEXT_ATTRIBUTES",
    "SUPPORTED_RESTATE",
    "AllCompletedUnresolvedFuture",
    "DefaultSerde",
    "DisconnectedException",
    "DoProgressAnyCompleted",
    "DoProgressCancelSignalReceived",
    "DoProgressExecuteRun",
    "FirstCompletedUnresolvedFuture",
    "RunOptions",
    "SdkInternalBaseException",
    "SdkInternalException",
    "ServerDurableFuture",
    "ServerInvocationContext",
    "SingleUnresolvedFuture",
    "Suspended",
    "SuspendedException",
    "TerminalError",
    "_restate_context_var",
    "check_context",
    "incompatible",
]
