"""Bursts on one thread across OS processes, each process's runs through one shared pool
with fewer connections than runs: 20 runs at once under each strategy, sync and async
(one process of each), a pool of 5. The full matrix (50 runs, a pool of 10) is
``scripts/contract_trials.py``.

Under ``enqueue`` every run waits holding no connection (it gives its connection back to
the pool and is woken by a listener of its own), so the run holding the thread always
gets one: every run finishes, one after another.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.contract._burst import burst, check


@pytest.mark.parametrize("strategy", ["enqueue", "reject", "interrupt", "rollback"])
def test_twenty_runs_at_once_through_a_pool_of_five(db: str, tmp_path: Path, strategy: str) -> None:
    thread = f"burst-{strategy}"
    found, _ = burst(db, thread, strategy, 20, 5, ("sync", "async"), tmp_path)
    check(db, thread, strategy, found)
