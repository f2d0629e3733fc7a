-- A guarded checkpoint write as one statement instead of two (the upsert, then
-- SELECT lgd_guard_put): each statement of a pipeline costs ~70 us of client and ~30 us
-- of server CPU, about 14 statements per graph run (docs/explanation/performance.md). The guard runs
-- after the upsert, as before, in the same implicit transaction: a refusal rolls both back.
-- A new function only: safe while older code, which never calls it, still runs.
CREATE OR REPLACE FUNCTION lgd_put_checkpoint(
    p_thread TEXT, p_ns TEXT, p_id TEXT, p_parent TEXT, p_checkpoint JSONB, p_metadata JSONB,
    p_run TEXT, p_attempt TEXT, p_ledger BOOLEAN, p_fingerprint TEXT
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
    VALUES (p_thread, p_ns, p_id, p_parent, p_checkpoint, p_metadata)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
    DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    PERFORM lgd_guard_put(p_thread, p_ns, coalesce(p_parent, ''), p_id, p_run, p_attempt,
                          p_ledger, p_fingerprint);
END
$$;
