-- PostgresJournal's one-round-trip protocol (runner/_postgres.py): a task's stored outcomes
-- read in one statement, and the fence of the task's next op checked by the outcome write
-- of its previous op. New functions only: workers on older code keep calling
-- lgd_journal_claim_v1 and their conditional UPDATE of an outcome (journal_complete in
-- their queries.sql), which read and write the same rows the same way.

-- The first claim of a task by an attempt (or a claim without a fresh fence check): as
-- lgd_journal_claim_v1 for p_key (same fencing, same takeover), then, in a later snapshot
-- (so it sees every outcome committed before the claim took its locks), every other op the
-- task has in the journal: stored (ok | error), or 'running' (claimed by an attempt, maybe
-- another one: such an op always needs a claim of its own). The row for p_key comes last:
-- ok | error (replay it) or 'run' (run it), with the server time of the claim, and fence_at
-- (as in lgd_journal_store_v2).
CREATE OR REPLACE FUNCTION lgd_journal_claim_v2(
    p_thread TEXT, p_task_ns TEXT, p_key TEXT, p_ns TEXT, p_checkpoint TEXT, p_run TEXT,
    p_attempt TEXT
) RETURNS TABLE (op_key TEXT, status TEXT, type TEXT, blob BYTEA, claimed_at TIMESTAMPTZ,
                fence_at TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
DECLARE
    c RECORD;
BEGIN
    -- Lock the attempts this claim may fence off before lgd_journal_claim_v1 does: its
    -- UPDATE then stamps fenced_at after every statement that had share-locked one of them
    -- (a claim, or a store that checked the fence) committed, so fenced_at orders after
    -- the fence checks it follows, as the rows do. (Without it, an UPDATE that waited on a
    -- share lock keeps the clock it read before the wait.)
    PERFORM 1 FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread AND a.attempt <> p_attempt AND a.fenced_by IS NULL
      AND (a.run_id = p_run
           OR a.attempt IN (SELECT j.attempt FROM lgd_journal j
                            WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns
                              AND j.op_key = p_key AND j.status = 'running'))
    ORDER BY a.attempt
    FOR UPDATE OF a;
    SELECT * INTO c FROM lgd_journal_claim_v1(p_thread, p_task_ns, p_key, p_ns, p_checkpoint,
                                              p_run, p_attempt);
    RETURN QUERY
    SELECT j.op_key, j.status, j.type, j.blob, j.claimed_at, NULL::timestamptz
    FROM lgd_journal j
    WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns AND j.op_key <> p_key;
    -- fence_at: when the claim found this attempt holding the thread (it raised
    -- otherwise; the attempt's row stays locked FOR SHARE until commit), unless another
    -- attempt holds the thread's lease. A replayed op leaves it to the task's next op.
    RETURN QUERY SELECT p_key, c.status, c.type, c.blob, c.claimed_at,
        CASE WHEN NOT EXISTS (SELECT 1 FROM lgd_leases l
                              WHERE l.thread_id = p_thread AND l.attempt <> p_attempt)
             THEN clock_timestamp() END;
END
$$;

-- Store an op's outcome, and say whether this attempt still holds the thread.
-- p_claimed: the op was claimed (lgd_journal_claim_*): stored only while this attempt still
-- holds that claim (as older workers' journal_complete). Otherwise it ran on the fence check of the
-- previous statement of its task (claim-ahead): stored only while this attempt is not
-- fenced off nor its checkpoint continued, and no other attempt claimed or stored the op.
-- p_fence_at (claim-ahead only): the fence check the op ran on, kept as its claimed_at.
-- Returns one row: stored (false: refused, the caller raises ConcurrentRunError) and
-- fence_at: the server time at which this attempt was seen holding the thread (NULL if it
-- was not), the fence check the task's next op may start on. The attempt's row is locked
-- FOR SHARE, as in a claim, so a takeover that commits later is ordered after fence_at.
CREATE OR REPLACE FUNCTION lgd_journal_store_v2(
    p_thread TEXT, p_task_ns TEXT, p_key TEXT, p_ns TEXT, p_checkpoint TEXT, p_run TEXT,
    p_attempt TEXT, p_claimed BOOLEAN, p_fence_at TIMESTAMPTZ, p_status TEXT, p_type TEXT,
    p_blob BYTEA
) RETURNS TABLE (stored BOOLEAN, fence_at TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
DECLARE
    fenced TEXT;
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
    SELECT a.fenced_by INTO fenced FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread AND a.attempt = p_attempt
    FOR SHARE;
    -- Also lost once another attempt holds the thread's lease (migration 0014): a retry of
    -- the run, or another run, was admitted. The journal's claims do not look at leases;
    -- only claim-ahead does, so it ends at the other attempt's admission, before its ops.
    holds := FOUND AND fenced IS NULL
             AND NOT lgd_journal_lost_v1(p_thread, p_ns, p_checkpoint, p_attempt)
             AND NOT EXISTS (SELECT 1 FROM lgd_leases l
                             WHERE l.thread_id = p_thread AND l.attempt <> p_attempt);
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
    RETURN QUERY SELECT true, CASE WHEN holds THEN clock_timestamp() END;
END
$$;
