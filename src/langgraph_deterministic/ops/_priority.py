"""The audit's CPU priority with ``--priority idle`` (opt-in; by default the audit leaves
every process's scheduling as it is): idle, so that live workers never wait for a core
behind it.

Measured on a quiet 2-core machine (docs/explanation/performance.md), a scan at the normal
priority moved 8 writers' p99 put latency ~5x: a woken writer's backend, or the one that
must issue the group commit's fsync, waited for the rest of the audit's time slice.
``SCHED_IDLE`` (Linux) runs a thread only when no other thread of its group wants the
core, and any woken one preempts it at once; with spare CPU (the usual case) the audit
runs at nearly full speed.

Two sides:

- the audit's own threads, set for the call and restored after (:func:`idle_thread`);
- its server backend, where the server runs on this machine and lets us (the same OS
  user, or ``CAP_SYS_NICE``): :func:`idle_backend`. The backend's pid comes from
  ``pg_backend_pid()``, and is used only if that process's start time on this kernel
  matches the backend's ``backend_start`` (a server in a container, or on another host,
  has its own pids). The backend exits with the audit's connection: nothing to restore.

``SCHED_IDLE`` orders threads within one scheduling group only. Linux groups by session
(autogroups: a terminal, a daemon) and by cgroup, and a group whose only runnable thread is
idle still gets a full group's share against the others: measured on that machine, the
server's session against the writers' one, an idle audit backend still moved their p99
~5x. So where the machine lets us (root, or a delegated cgroup), the idle threads also go
to a cgroup of their own with ``cpu.idle`` set (:data:`IDLE_CGROUP`): an idle group, which
any other woken thread preempts. Threads return to their group when the audit ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import psycopg

# How far the backend's start time on this kernel may be from its backend_start: /proc
# counts in clock ticks from the boot time, which is itself rounded to a second.
_START_SLACK_S: Final = 2.0

_IDLE = getattr(os, "SCHED_IDLE", None)  # Linux only

# The cgroup (under the cpu controller's root) the idle threads are moved to, where we may.
IDLE_CGROUP: Final = "lgd-idle"


def _cpu_hierarchy() -> tuple[Path, bool] | None:
    """The cpu controller's mount point and whether it is cgroup v2, if there is one."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        try:
            fstype, options = fields[fields.index("-") + 1], fields[fields.index("-") + 3]
        except (ValueError, IndexError):
            continue
        point = Path(fields[4])
        if fstype == "cgroup" and "cpu" in options.split(","):
            return point, False
        if fstype == "cgroup2":
            try:
                if "cpu" in (point / "cgroup.controllers").read_text().split():
                    return point, True
            except OSError:
                continue
    return None


def _idle_group() -> tuple[Path, bool] | None:
    """The idle cgroup, made on first use; None where the machine does not let us."""
    found = _cpu_hierarchy()
    if found is None:
        return None
    root, v2 = found
    group = root / IDLE_CGROUP
    try:
        group.mkdir(exist_ok=True)
        idle = group / "cpu.idle"
        if idle.exists():
            idle.write_text("1")
        else:  # kernels before 5.15: the smallest share instead
            (group / ("cpu.weight" if v2 else "cpu.shares")).write_text("1" if v2 else "2")
    except OSError:
        return None
    return group, v2


def release_idle_group(tries: int = 20) -> None:
    """Remove the idle cgroup once empty (best effort: another audit may be using it, and a
    closed connection's backend takes a moment to exit)."""
    found = _cpu_hierarchy()
    if found is None:
        return
    group = found[0] / IDLE_CGROUP
    for _ in range(tries):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # busy: tasks left in it
            time.sleep(0.01)


def _cgroup_of(tid: int, v2: bool) -> str | None:
    """Thread ``tid``'s cgroup path in the cpu hierarchy."""
    try:
        lines = Path(f"/proc/{os.getpid()}/task/{tid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
            return path
    return None


def _move(group: Path, v2: bool, task: int, *, process: bool) -> bool:
    """Move a thread (cgroup v1) or a single-threaded process (v2 or v1) into ``group``."""
    if v2 and not process:
        return False  # v2 moves whole processes only (threaded cgroups aside)
    try:
        (group / ("cgroup.procs" if v2 else "tasks")).write_text(str(task))
    except OSError:
        return False
    return True


def supported() -> bool:
    return _IDLE is not None and hasattr(os, "sched_setscheduler")


@contextmanager
def idle_thread(enabled: bool = True) -> Iterator[str]:
    """The calling thread at ``SCHED_IDLE``, in the idle cgroup where it may be, for the
    block; yields what it got: ``"idle"``, ``"idle, cgroup lgd-idle"`` or ``"normal"``."""
    if not enabled or not supported():
        yield "normal"
        return
    before = os.sched_getscheduler(0)
    param = os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, _IDLE, os.sched_param(0))  # type: ignore[arg-type]
    except OSError:
        yield "normal"
        return
    tid = threading.get_native_id()
    group = _idle_group()
    home = None if group is None else _cgroup_of(tid, group[1])
    moved = group is not None and home is not None and _move(*group, tid, process=False)
    try:
        yield f"idle, cgroup {IDLE_CGROUP}" if moved else "idle"
    finally:
        if moved and group is not None and home is not None:
            root = group[0].parent
            with suppress(OSError):
                (root / home.lstrip("/") / "tasks").write_text(str(tid))
        # leaving SCHED_IDLE needs RLIMIT_NICE headroom or CAP_SYS_NICE
        with suppress(OSError):
            os.sched_setscheduler(0, before, param)


def set_idle_thread() -> None:
    """A worker thread of the audit's own, idle for good (it ends with the audit)."""
    if supported():
        with suppress(OSError):
            os.sched_setscheduler(0, _IDLE, os.sched_param(0))  # type: ignore[arg-type]
            group = _idle_group()
            if group is not None:
                _move(*group, threading.get_native_id(), process=False)


def _started_at(pid: int) -> float | None:
    """When process ``pid`` of this kernel started (epoch seconds), if it is a postgres."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != "postgres":
            return None
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    # the fields after the command's ")": state is field 3, starttime field 22
    fields = stat[stat.rindex(")") + 2 :].split()
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def idle_backend(conn: psycopg.Connection[Any]) -> str:
    """Put ``conn``'s server backend at ``SCHED_IDLE`` where it runs on this machine.

    Returns what happened, for the report: ``"idle"``, ``"idle, cgroup lgd-idle"``, or
    ``"normal: <why not>"``.
    """
    if not supported():
        return "normal: SCHED_IDLE needs Linux"
    row = conn.execute(
        "SELECT pid, extract(epoch FROM backend_start)::float8 FROM pg_stat_activity "
        "WHERE pid = pg_backend_pid()"
    ).fetchone()
    if row is None or row[1] is None:
        return "normal: the server does not show this session's start"
    pid, backend_start = int(row[0]), float(row[1])
    started = _started_at(pid)
    if started is None or abs(started - backend_start) > _START_SLACK_S:
        return "normal: the server runs on another machine (or in a container)"
    try:
        os.sched_setscheduler(pid, _IDLE, os.sched_param(0))  # type: ignore[arg-type]
    except PermissionError:
        return "normal: the server runs as another OS user (CAP_SYS_NICE would allow it)"
    except OSError as exc:
        return f"normal: {exc.strerror or exc}"
    group = _idle_group()
    if group is not None and _move(*group, pid, process=True):
        return f"idle, cgroup {IDLE_CGROUP}"
    return "idle"
