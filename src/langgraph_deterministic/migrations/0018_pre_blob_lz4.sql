-- Channel values (checkpoint_blobs.blob, ~10 KB per graph step in benchmarks/) are
-- TOAST-compressed by every insert. lz4 costs the server ~40% less CPU per compressed
-- value than pglz (stores ~15% more) and ~1.1 ms less server CPU per graph run of the
-- benchmark (docs/explanation/performance.md). SET COMPRESSION changes only the catalog: values stored
-- before keep pglz and stay readable, nothing is rewritten, old workers see no difference.
--
-- Skipped cleanly where it cannot apply: servers before 14 or built without lz4, a column
-- already set. It is the one statement of ours that locks a table of the peer's, for a
-- catalog update only, and only if the lock is free: it waits at most the migration's
-- lock_timeout, and when the table is busy for that long it is skipped (a NOTICE says so)
-- rather than retried, since it is an optimisation and the queue behind a waiting ALTER
-- would stall writers. Apply it later by hand with the same statement (docs/migrations.md).
DO $$
BEGIN
    IF current_setting('server_version_num')::int < 140000
       OR NOT EXISTS (SELECT 1 FROM pg_settings
                      WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))
       OR EXISTS (SELECT 1 FROM pg_attribute
                  WHERE attrelid = to_regclass('checkpoint_blobs') AND attname = 'blob'
                    AND attcompression::text = 'l') THEN
        RETURN;
    END IF;
    BEGIN
        EXECUTE 'ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION lz4';
    EXCEPTION WHEN lock_not_available THEN
        RAISE NOTICE 'langgraph-deterministic: checkpoint_blobs was busy; lz4 compression of blob skipped (run ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION lz4 later)';
    END;
END
$$;
