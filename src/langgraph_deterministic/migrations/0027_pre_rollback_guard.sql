-- A rollback (multitask_strategy="rollback", or a retry's takeover of a dead run) of a run
-- one of whose checkpoints holds channel_versions that are not a JSON object (a row written
-- by hand or damaged): jsonb_each_text raised "cannot call jsonb_each_text on a
-- non-object" and the thread could not take its next run. The same function, guarded: such
-- a checkpoint is deleted with the run and frees no blob by name (audit reports the row as
-- unreadable). Same name and arguments: workers on older code call it unchanged.

CREATE OR REPLACE FUNCTION lgd_rollback_run_v3(p_thread TEXT, p_run TEXT, p_by TEXT)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH doomed AS (
        DELETE FROM checkpoints
        WHERE thread_id = p_thread AND (metadata ->> 'run_id') = p_run
        RETURNING checkpoint_ns, checkpoint_id, checkpoint -> 'channel_versions' AS versions
    ), writes AS (
        DELETE FROM checkpoint_writes w USING doomed d
        WHERE w.thread_id = p_thread AND w.checkpoint_ns = d.checkpoint_ns
          AND w.checkpoint_id = d.checkpoint_id
    ), chain AS (
        -- the slots the run's checkpoints held in their parents, and the ones they owned
        DELETE FROM lgd_chain ch USING doomed d
        WHERE ch.thread_id = p_thread AND ch.checkpoint_ns = d.checkpoint_ns
          AND (ch.checkpoint_id = d.checkpoint_id
               OR split_part(ch.parent_checkpoint_id, '~', 1) = d.checkpoint_id)
    ), freed AS (
        SELECT DISTINCT d.checkpoint_ns, v.key AS channel, v.value AS version
        FROM doomed d CROSS JOIN LATERAL jsonb_each_text(d.versions) AS v
        WHERE jsonb_typeof(d.versions) = 'object'  -- a corrupt row frees no blob, raises nothing
    ), blobs AS (
        DELETE FROM checkpoint_blobs b USING freed f
        WHERE b.thread_id = p_thread AND b.checkpoint_ns = f.checkpoint_ns
          AND b.channel = f.channel AND b.version = f.version
          AND NOT EXISTS (
              SELECT 1 FROM checkpoints c
              WHERE c.thread_id = p_thread AND c.checkpoint_ns = f.checkpoint_ns
                AND c.checkpoint -> 'channel_versions' ->> f.channel = f.version
                AND (c.metadata ->> 'run_id') IS DISTINCT FROM p_run)
    )
    SELECT count(*) INTO n FROM doomed;
    UPDATE lgd_runs SET status = 'rolled_back', superseded_by = p_by, updated_at = now()
    WHERE thread_id = p_thread AND run_id = p_run;
    RETURN n;
END
$$;
