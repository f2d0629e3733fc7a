-- lgd:no-transaction
-- delete_for_runs() finds a run's ledger rows by run id alone; the ledger's key starts
-- with thread_id, so without this it scanned all of lgd_runs. Our own table, built
-- CONCURRENTLY: writers of the ledger are never blocked. Phase pre: old code ignores it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS lgd_runs_run_id_idx ON lgd_runs (run_id);
