-- The checkpoint tables, column for column those of langgraph-checkpoint-postgres at its
-- migration v9, so a deployment can switch savers in either direction. Every statement is
-- IF NOT EXISTS (CREATE TABLE IF NOT EXISTS locks nothing when the table exists): on a
-- database PostgresSaver already set up, nothing of theirs changes or is locked.
CREATE TABLE IF NOT EXISTS checkpoint_migrations (
    v INTEGER PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

CREATE TABLE IF NOT EXISTS checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT,
    blob BYTEA NOT NULL,
    task_path TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- A database PostgresSaver created before its v9 lacks this column. ADD COLUMN with a
-- constant default is a catalog-only change (no table rewrite) since Postgres 11, but
-- ALTER TABLE takes ACCESS EXCLUSIVE even when IF NOT EXISTS then finds the column: it
-- would queue behind any open transaction on the table, and every worker behind it. So
-- the catalog is read first and the ALTER runs only when the column is missing (under
-- the migration's short lock_timeout, retried by the runner).
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = to_regclass('checkpoint_writes') AND attname = 'task_path'
          AND NOT attisdropped
    ) THEN
        ALTER TABLE checkpoint_writes ADD COLUMN task_path TEXT NOT NULL DEFAULT '';
    END IF;
END
$$;

-- Record the peer's versions we have brought the schema to, so PostgresSaver.setup() run
-- later finds nothing to do. Rows that are already there are left alone.
INSERT INTO checkpoint_migrations (v)
SELECT generate_series(0, 9)
ON CONFLICT (v) DO NOTHING;
