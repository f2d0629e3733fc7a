-- Writes that meet a database which lost what it had acknowledged: after a failover to a
-- standby that had not received the last WAL (asynchronous replication), or one that had
-- not received the commits made without waiting for it (synchronous_commit off). New
-- functions only: workers on older code keep calling lgd_put_checkpoint_v6 alone and
-- lgd_journal_store_v3, on the same rows.

-- A checkpoint's parent must exist: a writer that did not notice the failover continues
-- a checkpoint the new primary never received. Called in the statement of the put itself
-- (guarded_put_checkpoint), after lgd_put_checkpoint_v6, so that statement's own refusals
-- come first and this one rolls its writes back. LG414: the caller's retry (same run id)
-- continues from the thread's surviving head instead of growing a branch on a lost one.
CREATE OR REPLACE FUNCTION lgd_require_parent_v1(p_thread TEXT, p_ns TEXT, p_parent TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_parent IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_parent
    ) THEN
        RAISE EXCEPTION 'lgd: the parent checkpoint is not in the database'
            USING ERRCODE = 'LG414',
                  DETAIL = format('checkpoint %s in namespace %L', p_parent, p_ns);
    END IF;
END
$$;

-- As lgd_journal_store_v3 (migration 0020), and tells a lost claim or registration from a
-- takeover. A claimed op whose row is gone (no row at all: the claim, committed without
-- waiting for the WAL flush, was lost) is stored as an op run on a fence check is: only
-- while this attempt still holds the thread. lost: the attempt's own row in
-- lgd_journal_attempts is gone (its admission or first claim was lost), so the database
-- cannot tell whether it still holds the thread; nothing is stored and the caller raises
-- a retryable DatabaseUnavailableError rather than ConcurrentRunError.
CREATE OR REPLACE FUNCTION lgd_journal_store_v4(
    p_thread TEXT, p_task_ns TEXT, p_key TEXT, p_ns TEXT, p_checkpoint TEXT, p_run TEXT,
    p_attempt TEXT, p_claimed BOOLEAN, p_fence_at TIMESTAMPTZ, p_status TEXT, p_type TEXT,
    p_blob BYTEA
) RETURNS TABLE (stored BOOLEAN, fence_at TIMESTAMPTZ, lost BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
    holds BOOLEAN;
    free BOOLEAN;
    claimed BOOLEAN := p_claimed;
BEGIN
    IF claimed THEN
        UPDATE lgd_journal j
        SET status = p_status, type = p_type, blob = p_blob, completed_at = clock_timestamp()
        WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns AND j.op_key = p_key
          AND j.attempt = p_attempt AND j.status = 'running';
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM lgd_journal j
                       WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns
                         AND j.op_key = p_key) THEN
                RETURN QUERY SELECT false, NULL::timestamptz, false;  -- taken over
                RETURN;
            END IF;
            claimed := false;  -- the claim was lost: store only while the fence holds
        END IF;
    END IF;
    SELECT a.fenced_by IS NULL,
           NOT EXISTS (
               SELECT 1 FROM lgd_chain ch
               WHERE ch.thread_id = p_thread AND ch.checkpoint_ns = p_ns
                 AND ch.parent_checkpoint_id = p_checkpoint
                 AND ch.attempt IS DISTINCT FROM p_attempt
                 AND NOT (ch.checkpoint_id LIKE 'refused:%'))
           AND NOT EXISTS (SELECT 1 FROM lgd_leases l
                           WHERE l.thread_id = p_thread AND l.attempt <> p_attempt)
    INTO free, holds
    FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread AND a.attempt = p_attempt
    FOR SHARE OF a;
    IF NOT FOUND THEN  -- stored if its claim was there; else it may not be
        RETURN QUERY SELECT claimed, NULL::timestamptz, NOT claimed;
        RETURN;
    END IF;
    holds := free AND holds;
    IF NOT claimed THEN
        IF NOT holds THEN
            RETURN QUERY SELECT false, NULL::timestamptz, false;
            RETURN;
        END IF;
        INSERT INTO lgd_journal AS j (thread_id, task_ns, op_key, checkpoint_ns, checkpoint_id,
                                      run_id, attempt, status, type, blob, claimed_at,
                                      completed_at)
        VALUES (p_thread, p_task_ns, p_key, p_ns, p_checkpoint, p_run, p_attempt, p_status,
                p_type, p_blob, coalesce(p_fence_at, statement_timestamp()), clock_timestamp())
        ON CONFLICT (thread_id, task_ns, op_key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT false, NULL::timestamptz, false;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT true, CASE WHEN holds THEN statement_timestamp() END, false;
END
$$;
