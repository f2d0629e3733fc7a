-- lgd:no-transaction
-- Makes list(filter={"run_id": ...}) and delete_for_runs() an index lookup instead of a
-- scan of every checkpoint. Partial: checkpoints written without a run_id cost nothing.
-- Queries match it with `metadata ->> 'run_id' = ...`, which implies IS NOT NULL.
CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoints_run_id_idx
    ON checkpoints ((metadata ->> 'run_id'))
    WHERE (metadata ->> 'run_id') IS NOT NULL;
