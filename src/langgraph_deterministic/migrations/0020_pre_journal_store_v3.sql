-- PostgresJournal's outcome write in fewer statements (runner/_postgres.py): the fence
-- check of lgd_journal_store_v2 - the attempt's row locked FOR SHARE, not fenced off, its
-- checkpoint not continued (the rule of lgd_journal_lost_v1), nobody else holding the
-- thread's lease - as one statement instead of three and a function call. The same rows
-- read and written the same way: workers on older code keep calling
-- lgd_journal_store_v2 on the same journal. New function only.

-- As lgd_journal_store_v2 (migration 0013), except for fence_at: the start of the calling
-- statement, which precedes the snapshot the fence was checked in (everything committed
-- before fence_at was seen). A takeover that was committing when the check locked the
-- attempt's row is seen on its newest version (fenced_by); one that commits later waits
-- for this transaction and stamps fenced_at after fence_at.
CREATE OR REPLACE FUNCTION lgd_journal_store_v3(
    p_thread TEXT, p_task_ns TEXT, p_key TEXT, p_ns TEXT, p_checkpoint TEXT, p_run TEXT,
    p_attempt TEXT, p_claimed BOOLEAN, p_fence_at TIMESTAMPTZ, p_status TEXT, p_type TEXT,
    p_blob BYTEA
) RETURNS TABLE (stored BOOLEAN, fence_at TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
DECLARE
    holds BOOLEAN;
BEGIN
    IF p_claimed THEN
        UPDATE lgd_journal j
        SET status = p_status, type = p_type, blob = p_blob, completed_at = clock_timestamp()
        WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns AND j.op_key = p_key
          AND j.attempt = p_attempt AND j.status = 'running';
        IF NOT FOUND THEN
            RETURN QUERY SELECT false, NULL::timestamptz;
            RETURN;
        END IF;
    END IF;
    SELECT NOT EXISTS (
               SELECT 1 FROM lgd_chain ch
               WHERE ch.thread_id = p_thread AND ch.checkpoint_ns = p_ns
                 AND ch.parent_checkpoint_id = p_checkpoint
                 AND ch.attempt IS DISTINCT FROM p_attempt
                 AND NOT (ch.checkpoint_id LIKE 'refused:%'))
           AND NOT EXISTS (SELECT 1 FROM lgd_leases l
                           WHERE l.thread_id = p_thread AND l.attempt <> p_attempt)
    INTO holds
    FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread AND a.attempt = p_attempt AND a.fenced_by IS NULL
    FOR SHARE OF a;
    holds := coalesce(holds, false);  -- no row: fenced off (or never registered)
    IF NOT p_claimed THEN
        IF NOT holds THEN
            RETURN QUERY SELECT false, NULL::timestamptz;
            RETURN;
        END IF;
        INSERT INTO lgd_journal AS j (thread_id, task_ns, op_key, checkpoint_ns, checkpoint_id,
                                      run_id, attempt, status, type, blob, claimed_at,
                                      completed_at)
        VALUES (p_thread, p_task_ns, p_key, p_ns, p_checkpoint, p_run, p_attempt, p_status,
                p_type, p_blob, p_fence_at, clock_timestamp())
        ON CONFLICT (thread_id, task_ns, op_key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT false, NULL::timestamptz;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT true, CASE WHEN holds THEN statement_timestamp() END;
END
$$;
