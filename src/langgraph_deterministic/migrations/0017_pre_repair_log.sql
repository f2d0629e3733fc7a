-- What `langgraph-deterministic repair --apply` did: one row per repaired thread, written
-- in the same transaction as the repair. A new table only: nothing existing changes.
CREATE TABLE IF NOT EXISTS lgd_repairs (
    repair_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    faults TEXT[] NOT NULL,
    actions JSONB NOT NULL,
    old_head TEXT NOT NULL,
    new_head TEXT,
    backup_thread_id TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS lgd_repairs_thread_idx ON lgd_repairs (thread_id);
