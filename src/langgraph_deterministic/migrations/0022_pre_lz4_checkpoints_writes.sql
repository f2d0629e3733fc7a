-- lz4 also for the two other values a graph run compresses: checkpoints.checkpoint (the
-- jsonb passes the ~2 KB TOAST threshold once a graph has a dozen channels: ~5 of the 14
-- checkpoints of the benchmark graph's run) and checkpoint_writes.blob (a write carrying a
-- conversation, e.g. the input). pglz spends ~700k instructions per such value, lz4 a
-- fraction: callgrind of the server's backend, ~-5M of ~29M instructions per benchmark run
-- (docs/explanation/performance.md). As 0018: SET COMPRESSION changes only the catalog,
-- values stored before keep pglz and stay readable, old workers see no difference; skipped
-- where the server lacks lz4 or a column is set already, and, per table, when the table is
-- busy for longer than the migration's lock_timeout (a NOTICE says so; apply it later by
-- hand with the same statement, docs/migrations.md).
DO $$
DECLARE
    target RECORD;
BEGIN
    IF current_setting('server_version_num')::int < 140000
       OR NOT EXISTS (SELECT 1 FROM pg_settings
                      WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)) THEN
        RETURN;
    END IF;
    FOR target IN
        SELECT t.tab, t.col FROM (VALUES ('checkpoints', 'checkpoint'),
                                         ('checkpoint_writes', 'blob')) AS t (tab, col)
        WHERE NOT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = to_regclass(t.tab) AND attname = t.col
                            AND attcompression::text = 'l')
    LOOP
        BEGIN
            EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET COMPRESSION lz4',
                           target.tab, target.col);
        EXCEPTION WHEN lock_not_available THEN
            RAISE NOTICE 'langgraph-deterministic: % was busy; lz4 compression of % skipped (run ALTER TABLE % ALTER COLUMN % SET COMPRESSION lz4 later)',
                target.tab, target.col, target.tab, target.col;
        END;
    END LOOP;
END
$$;
