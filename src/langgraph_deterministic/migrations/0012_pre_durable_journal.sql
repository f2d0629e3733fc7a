-- The durable-op journal of PostgresJournal (runner/_postgres.py): durable ops inside
-- nodes, keyed by the task that runs them, next to the checkpoints and fenced by the same
-- attempt tokens. New tables and functions only: nothing existing is touched.

-- One row per durable op. task_ns is the checkpoint namespace LangGraph gives the task
-- (`node:<task id>`, nested with `|` for subgraphs): task ids derive from the checkpoint
-- the task runs from, so a retry resuming that checkpoint finds the same rows.
--   status: running (claimed by `attempt`, no outcome yet) | ok | error (terminal)
--   executions: how many times an attempt was allowed to run the op's function
CREATE TABLE IF NOT EXISTS lgd_journal (
    thread_id TEXT NOT NULL,
    task_ns TEXT NOT NULL,
    op_key TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    run_id TEXT,
    attempt TEXT NOT NULL,
    status TEXT NOT NULL,
    executions INTEGER NOT NULL DEFAULT 1,
    type TEXT,
    blob BYTEA,
    claimed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    completed_at TIMESTAMPTZ,
    PRIMARY KEY (thread_id, task_ns, op_key)
);

-- delete_for_runs removes a run's ops.
CREATE INDEX IF NOT EXISTS lgd_journal_run_idx ON lgd_journal (run_id);

-- The attempts that claimed ops on a thread, and whether another attempt fenced them off
-- (by taking over an op they had claimed). Claims lock their attempt's row FOR SHARE and a
-- takeover updates it, so once a takeover has committed, no claim of the fenced attempt
-- can succeed.
CREATE TABLE IF NOT EXISTS lgd_journal_attempts (
    thread_id TEXT NOT NULL,
    attempt TEXT NOT NULL,
    run_id TEXT,
    fenced_by TEXT,
    fenced_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, attempt)
);

-- delete_for_runs removes a run's attempts; a retry's first claim fences the run's others.
CREATE INDEX IF NOT EXISTS lgd_journal_attempts_run_idx ON lgd_journal_attempts (run_id);

-- The fencing hook, on the saver's checkpoint chain: has another attempt continued the
-- checkpoint this task runs from? (A slot held for a refused attempt bars only that
-- attempt, as in lgd_guard_put.) A lease-based rule gets a new name, and a new claim
-- function that calls it.
CREATE OR REPLACE FUNCTION lgd_journal_lost_v1(
    p_thread TEXT, p_ns TEXT, p_checkpoint TEXT, p_attempt TEXT
) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM lgd_chain ch
        WHERE ch.thread_id = p_thread AND ch.checkpoint_ns = p_ns
          AND ch.parent_checkpoint_id = p_checkpoint
          AND ch.attempt IS DISTINCT FROM p_attempt
          AND NOT (ch.checkpoint_id LIKE 'refused:%')
    )
$$;

-- Claim one op for an attempt, in one statement. Returns the stored outcome (status ok or
-- error, with the serialised value) if there is one; otherwise status 'run': the caller
-- runs the op's function and stores its outcome with a conditional UPDATE (journal_complete
-- in queries.sql), which fails if another attempt took the op over meanwhile.
-- Takeover: an attempt's first claim on a thread fences off every other attempt of the
-- same run there (the retry takes over from the zombie), and claiming an op in flight in
-- another attempt fences that one. Raises LG430 when this attempt has lost the thread
-- (fenced, or its checkpoint was continued by another attempt): fn never runs then.
CREATE OR REPLACE FUNCTION lgd_journal_claim_v1(
    p_thread TEXT, p_task_ns TEXT, p_key TEXT, p_ns TEXT, p_checkpoint TEXT, p_run TEXT,
    p_attempt TEXT
) RETURNS TABLE (status TEXT, type TEXT, blob BYTEA, claimed_at TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
DECLARE
    found_row lgd_journal;
    fenced TEXT;
BEGIN
    -- A claim need not survive a server crash (a lost claim is an op not yet claimed, and
    -- the next durable commit flushes it anyway): skip the WAL flush wait. Only the
    -- outcome write pays it, so a new op costs one flush, as a checkpoint write does.
    PERFORM set_config('synchronous_commit', 'off', true);
    IF lgd_journal_lost_v1(p_thread, p_ns, p_checkpoint, p_attempt) THEN
        RAISE EXCEPTION 'lgd: attempt lost the thread'
            USING ERRCODE = 'LG430',
                  DETAIL = format('checkpoint %s in namespace %L was continued by another attempt',
                                  p_checkpoint, p_ns);
    END IF;
    INSERT INTO lgd_journal_attempts AS a (thread_id, attempt, run_id)
    VALUES (p_thread, p_attempt, p_run)
    ON CONFLICT (thread_id, attempt) DO NOTHING;
    IF FOUND AND p_run IS NOT NULL THEN
        UPDATE lgd_journal_attempts a SET fenced_by = p_attempt, fenced_at = clock_timestamp()
        WHERE a.thread_id = p_thread AND a.run_id = p_run AND a.attempt <> p_attempt
          AND a.fenced_by IS NULL;
    END IF;
    -- The share lock orders this claim after any takeover of this attempt that is
    -- committing: once a takeover has committed, no claim of the fenced attempt succeeds.
    SELECT a.fenced_by INTO fenced FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread AND a.attempt = p_attempt
    FOR SHARE;
    IF fenced IS NOT NULL THEN
        RAISE EXCEPTION 'lgd: attempt fenced off'
            USING ERRCODE = 'LG430',
                  DETAIL = format('attempt %s of the run took over from this attempt', fenced);
    END IF;
    INSERT INTO lgd_journal AS j (thread_id, task_ns, op_key, checkpoint_ns, checkpoint_id,
                                  run_id, attempt, status)
    VALUES (p_thread, p_task_ns, p_key, p_ns, p_checkpoint, p_run, p_attempt, 'running')
    ON CONFLICT (thread_id, task_ns, op_key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT * INTO found_row FROM lgd_journal j
        WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns AND j.op_key = p_key
        FOR UPDATE;
        IF found_row.status <> 'running' THEN
            RETURN QUERY SELECT found_row.status, found_row.type, found_row.blob,
                                found_row.claimed_at;
            RETURN;
        END IF;
        IF found_row.attempt <> p_attempt THEN
            -- In flight in another attempt (dead, or alive and slow: we cannot tell):
            -- take the op over and fence that attempt off.
            UPDATE lgd_journal_attempts a SET fenced_by = p_attempt, fenced_at = clock_timestamp()
            WHERE a.thread_id = p_thread AND a.attempt = found_row.attempt AND a.fenced_by IS NULL;
        END IF;
        UPDATE lgd_journal j SET attempt = p_attempt, run_id = p_run,
                                 executions = j.executions + 1, claimed_at = clock_timestamp()
        WHERE j.thread_id = p_thread AND j.task_ns = p_task_ns AND j.op_key = p_key;
    END IF;
    RETURN QUERY SELECT 'run'::text, NULL::text, NULL::bytea, clock_timestamp();
END
$$;
