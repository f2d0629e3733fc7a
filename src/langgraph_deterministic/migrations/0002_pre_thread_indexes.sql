-- lgd:no-transaction
-- The peer's per-thread indexes (its migrations 6-8), built without blocking writes.
-- A build that was interrupted leaves an INVALID index behind, which IF NOT EXISTS would
-- keep forever; the migration runner drops such leftovers before running this file.
CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoints_thread_id_idx ON checkpoints (thread_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoint_blobs_thread_id_idx ON checkpoint_blobs (thread_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS checkpoint_writes_thread_id_idx ON checkpoint_writes (thread_id);
