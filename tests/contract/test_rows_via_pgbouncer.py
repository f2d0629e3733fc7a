"""The retry contract's rows (test_rows.py), every one of them, through a real PgBouncer in
transaction pooling mode: the savers there are built from a DSN, which here reaches the
database through the bouncer (a DSN saver finds the pooler when it first connects and then
prepares nothing). The schema is migrated once over a direct connection."""

from __future__ import annotations

import pytest
from tests.contract.test_rows import *  # noqa: F403  (re-collected here, against the bouncer)
from tests.pgbouncer import PgBouncer

from langgraph_deterministic.checkpointer import DeterministicSaver


@pytest.fixture(scope="module")
def db(dsn: str, pgbouncer: PgBouncer) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return pgbouncer.dsn_for(dsn)


# Counts round trips on a connection of its own (default prepare threshold), not the
# saver's: not a property of the route to the server.
del test_contract_adds_no_round_trip_to_writes_or_reads  # noqa: F821
del test_the_lease_costs_two_statements_and_one_round_trip_per_run  # noqa: F821  (likewise)
