-- PostgresJournal's first new op without a claim of its own (runner/_postgres.py): the
-- admission of a journaled graph run registers its attempt in the journal, as its first
-- claim would, in the statement the saver sends anyway (the head read's pipeline). New
-- functions only: lgd_admit_v3 is called as is; workers on older code keep calling it
-- and registering at their first claim, on the same rows.

-- lgd_admit_v3, and when it admits: the attempt's row in lgd_journal_attempts, taking the
-- run over from its other attempts there (fenced_by), as lgd_journal_claim_v2 does at an
-- attempt's first claim. The admission is the takeover: no op of an attempt it fenced can
-- be claimed or stored once it has committed. fence_at: when the attempt was seen holding
-- the thread (it just took the lease; its row, new, cannot be fenced before this commits),
-- the fence check a first op of a task of a checkpoint the run creates may start on; NULL
-- when not admitted, or when the row existed already (nothing registered: claim first).
CREATE OR REPLACE FUNCTION lgd_journal_admit_v1(
    p_thread TEXT, p_run TEXT, p_attempt TEXT, p_strategy TEXT, p_ttl DOUBLE PRECISION,
    p_ticket BIGINT
) RETURNS TABLE (
    verdict TEXT, ticket BIGINT, holder_run TEXT, holder_attempt TEXT,
    holder_expires_at TIMESTAMPTZ, holder_ended TEXT, holder_strategy TEXT,
    holder_outcome TEXT, holder_acquired_at TIMESTAMPTZ, outcome TEXT, fence_at TIMESTAMPTZ
) LANGUAGE plpgsql AS $$
DECLARE
    adm RECORD;
    v_fence TIMESTAMPTZ;
BEGIN
    SELECT * INTO adm FROM lgd_admit_v3(p_thread, p_run, p_attempt, p_strategy, p_ttl,
                                        p_ticket) AS x;
    IF adm.verdict = 'admitted' THEN
        -- As in lgd_journal_claim_v2: lock the attempts this may fence off first, so that
        -- fenced_at is stamped after every statement that share-locked one of them (a
        -- claim, or a store that checked the fence) committed.
        PERFORM 1 FROM lgd_journal_attempts a
        WHERE a.thread_id = p_thread AND a.run_id = p_run AND a.attempt <> p_attempt
          AND a.fenced_by IS NULL
        ORDER BY a.attempt
        FOR UPDATE OF a;
        INSERT INTO lgd_journal_attempts AS a (thread_id, attempt, run_id)
        VALUES (p_thread, p_attempt, p_run)
        ON CONFLICT (thread_id, attempt) DO NOTHING;
        IF FOUND THEN
            UPDATE lgd_journal_attempts a SET fenced_by = p_attempt, fenced_at = clock_timestamp()
            WHERE a.thread_id = p_thread AND a.run_id = p_run AND a.attempt <> p_attempt
              AND a.fenced_by IS NULL;
            v_fence := statement_timestamp();
        END IF;
    END IF;
    RETURN QUERY SELECT adm.verdict, adm.ticket, adm.holder_run, adm.holder_attempt,
        adm.holder_expires_at, adm.holder_ended, adm.holder_strategy, adm.holder_outcome,
        adm.holder_acquired_at, adm.outcome, v_fence;
END
$$;

-- Undo lgd_journal_admit_v1's registration of an admission the saver then refused (with
-- lgd_unadmit_v3, in one transaction): the attempt's row goes, and the attempts it had
-- fenced off get its own state back (free, or fenced by whoever fenced it meanwhile: that
-- admission would have fenced them too). The attempt token is new to the thread and the
-- refused call ran nothing, so these are exactly the rows its admission wrote.
CREATE OR REPLACE FUNCTION lgd_journal_unadmit_v1(p_thread TEXT, p_attempt TEXT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    mine lgd_journal_attempts;
BEGIN
    SELECT * INTO mine FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread AND a.attempt = p_attempt
    FOR UPDATE;
    UPDATE lgd_journal_attempts a SET fenced_by = mine.fenced_by, fenced_at = mine.fenced_at
    WHERE a.thread_id = p_thread AND a.fenced_by = p_attempt;
    DELETE FROM lgd_journal_attempts a WHERE a.thread_id = p_thread AND a.attempt = p_attempt;
END
$$;
