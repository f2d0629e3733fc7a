-- Retention sweeps (DeterministicSaver.sweep, `langgraph-deterministic prune`): new tables
-- and functions only, so workers on older code run beside it unchanged.

-- Tombstones of swept runs: a retry of one is refused (RunSweptError) instead of applying
-- its input again to the emptied or trimmed thread. Kept for the policy's
-- tombstone_ttl, then deleted by a later sweep (lgd_swept_runs_swept_at_idx).
CREATE TABLE IF NOT EXISTS lgd_swept_runs (
    thread_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    ledger_status TEXT NOT NULL,
    input_fingerprint TEXT,
    strategy TEXT NOT NULL,
    swept_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, run_id)
);
CREATE INDEX IF NOT EXISTS lgd_swept_runs_swept_at_idx ON lgd_swept_runs (swept_at);

-- One row per swept thread: time travel to a checkpoint the sweep removed names the sweep
-- (CheckpointPrunedError). Same retention as the runs' tombstones.
CREATE TABLE IF NOT EXISTS lgd_swept_threads (
    thread_id TEXT PRIMARY KEY,
    strategy TEXT NOT NULL,
    kept_checkpoint_id TEXT,
    swept_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS lgd_swept_threads_swept_at_idx ON lgd_swept_threads (swept_at);

-- Rows and bytes a thread holds in every table (the values' stored sizes), with the
-- backups repair keeps of it.
CREATE OR REPLACE FUNCTION lgd_thread_footprint_v1(p_ids TEXT[])
RETURNS TABLE (n_rows BIGINT, n_bytes BIGINT) LANGUAGE sql STABLE AS $$
    -- The peer's tables by their wide columns' stored (compressed, TOASTed) sizes, read
    -- without detoasting them (a whole-row pg_column_size(t.*) would); ours whole.
    SELECT sum(n)::bigint, sum(b)::bigint FROM (
        SELECT count(*) AS n,
               coalesce(sum(pg_column_size(t.checkpoint) + pg_column_size(t.metadata)), 0) AS b
        FROM checkpoints t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(coalesce(pg_column_size(t.blob), 0)), 0)
        FROM checkpoint_blobs t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.blob)), 0)
        FROM checkpoint_writes t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)
        FROM lgd_chain t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)
        FROM lgd_runs t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)
        FROM lgd_leases t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)
        FROM lgd_queue t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(coalesce(pg_column_size(t.blob), 0)), 0)
        FROM lgd_journal t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)
        FROM lgd_journal_attempts t WHERE t.thread_id = ANY(p_ids)
        UNION ALL SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)
        FROM lgd_repairs t WHERE t.thread_id = ANY(p_ids)
    ) s
$$;

-- The first statement of a thread's sweep transaction. Takes the thread's lease row as a
-- run's admission does (FOR UPDATE, or a placeholder row when it has none), so a run
-- starting meanwhile waits for this transaction and then finds the thread as the sweep
-- left it: nothing it wrote is deleted. Under that lock it checks again what the scan
-- saw (p_latest: the thread's greatest checkpoint id; p_before: its TTL's cutoff) and
-- answers 'go' or why the thread is left as it is: leased (a live lease: a run in flight),
-- queued (a run waits for it), written (written since the scan, or its ledger or journal
-- is younger than the cutoff), interrupted (an interrupt waits for its resume and
-- p_expire_interrupted is false), delta (keep_latest of a LangGraph.js DeltaChannel
-- thread), busy (a lock not granted within lock_timeout).
-- On 'go' it writes the tombstones of the runs the sweep removes and marks the thread
-- for the statements after it (lgd.sweep = p_token, for this transaction only).
CREATE OR REPLACE FUNCTION lgd_sweep_claim_v1(
    p_thread TEXT, p_latest TEXT, p_before TIMESTAMPTZ, p_strategy TEXT,
    p_expire_interrupted BOOLEAN, p_token TEXT, p_lock_timeout TEXT
) RETURNS TABLE (verdict TEXT, backups TEXT[], n_rows BIGINT, n_bytes BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    cur lgd_leases;
    placed BOOLEAN := false;
    reason TEXT;
    head_id TEXT;
    head_run TEXT;
    ids TEXT[];
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        SELECT * INTO cur FROM lgd_leases l WHERE l.thread_id = p_thread FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO lgd_leases (thread_id, run_id, attempt, strategy, outcome, ttl, expires_at)
            VALUES (p_thread, 'lgd-sweep', p_token, 'reject', 'sweep', interval '1 minute',
                    now() + interval '1 minute')
            ON CONFLICT (thread_id) DO NOTHING;
            IF NOT FOUND THEN
                RETURN QUERY SELECT 'leased'::text, NULL::text[], 0::bigint, 0::bigint;
                RETURN;
            END IF;
            placed := true;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN QUERY SELECT 'busy'::text, NULL::text[], 0::bigint, 0::bigint;
        RETURN;
    END;
    IF NOT placed AND cur.ended IS NULL AND cur.expires_at > now() THEN
        reason := 'leased';
    ELSIF EXISTS (SELECT 1 FROM lgd_queue q
                  WHERE q.thread_id = p_thread AND q.expires_at > now()) THEN
        reason := 'queued';
    ELSIF (SELECT max(c.checkpoint_id) FROM checkpoints c WHERE c.thread_id = p_thread)
              IS DISTINCT FROM p_latest
          OR EXISTS (SELECT 1 FROM lgd_runs r
                     WHERE r.thread_id = p_thread AND r.updated_at >= p_before)
          OR EXISTS (SELECT 1 FROM lgd_journal j
                     WHERE j.thread_id = p_thread
                       AND greatest(j.claimed_at, j.completed_at) >= p_before) THEN
        reason := 'written';
    END IF;
    SELECT c.checkpoint_id, c.metadata ->> 'run_id' INTO head_id, head_run
    FROM checkpoints c WHERE c.thread_id = p_thread AND c.checkpoint_ns = ''
    ORDER BY c.checkpoint_id DESC LIMIT 1;
    IF reason IS NULL AND NOT p_expire_interrupted AND EXISTS (
        SELECT 1 FROM checkpoint_writes w
        WHERE w.thread_id = p_thread AND w.checkpoint_ns = '' AND w.checkpoint_id = head_id
          AND w.channel = '__interrupt__') THEN
        reason := 'interrupted';
    END IF;
    -- A LangGraph.js DeltaChannel thread (marked delta_writes_versioned, no counters):
    -- its window is not known here, so keep_latest keeps it whole. Python's threads keep
    -- their window (the sweep's variant of prune_keep_latest).
    IF reason IS NULL AND p_strategy = 'keep_latest' AND EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.metadata ? 'delta_writes_versioned') THEN
        reason := 'delta';
    END IF;
    IF reason IS NOT NULL THEN
        IF placed THEN
            DELETE FROM lgd_leases l WHERE l.thread_id = p_thread AND l.attempt = p_token;
        END IF;
        RETURN QUERY SELECT reason, NULL::text[], 0::bigint, 0::bigint;
        RETURN;
    END IF;
    SELECT coalesce(array_agg(DISTINCT r.backup_thread_id), '{}') INTO ids
    FROM lgd_repairs r WHERE r.thread_id = p_thread;
    -- keep_latest keeps the ledger row of the run that wrote the kept head: a retry of
    -- that run still finds it; every other run's checkpoints are gone with the history.
    INSERT INTO lgd_swept_runs AS s (thread_id, run_id, ledger_status, input_fingerprint,
                                     strategy)
    SELECT r.thread_id, r.run_id, r.status, r.input_fingerprint, p_strategy
    FROM lgd_runs r
    WHERE r.thread_id = p_thread
      AND (p_strategy = 'delete' OR r.run_id IS DISTINCT FROM head_run)
    ON CONFLICT (thread_id, run_id) DO UPDATE
        SET ledger_status = EXCLUDED.ledger_status, strategy = EXCLUDED.strategy,
            input_fingerprint = EXCLUDED.input_fingerprint, swept_at = now();
    INSERT INTO lgd_swept_threads AS s (thread_id, strategy, kept_checkpoint_id)
    VALUES (p_thread, p_strategy, CASE WHEN p_strategy = 'keep_latest' THEN head_id END)
    ON CONFLICT (thread_id) DO UPDATE
        SET strategy = EXCLUDED.strategy, kept_checkpoint_id = EXCLUDED.kept_checkpoint_id,
            swept_at = now();
    PERFORM set_config('lgd.sweep', p_token, true);
    RETURN QUERY SELECT 'go'::text, ids, f.n_rows, f.n_bytes
                 FROM lgd_thread_footprint_v1(p_thread || ids) f;
END
$$;

-- strategy delete, after lgd_sweep_claim_v1 said 'go': the thread and its backups, whole.
CREATE OR REPLACE FUNCTION lgd_sweep_delete_v1(p_thread TEXT, p_token TEXT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ids TEXT[];
BEGIN
    IF current_setting('lgd.sweep', true) IS DISTINCT FROM p_token THEN
        RETURN;  -- not claimed in this transaction: nothing to do
    END IF;
    SELECT p_thread || coalesce(array_agg(DISTINCT r.backup_thread_id), '{}') INTO ids
    FROM lgd_repairs r WHERE r.thread_id = p_thread;
    DELETE FROM checkpoints WHERE thread_id = ANY(ids);
    DELETE FROM checkpoint_blobs WHERE thread_id = ANY(ids);
    DELETE FROM checkpoint_writes WHERE thread_id = ANY(ids);
    DELETE FROM lgd_chain WHERE thread_id = ANY(ids);
    DELETE FROM lgd_runs WHERE thread_id = ANY(ids);
    DELETE FROM lgd_leases WHERE thread_id = ANY(ids);
    DELETE FROM lgd_queue WHERE thread_id = ANY(ids);
    DELETE FROM lgd_journal WHERE thread_id = ANY(ids);
    DELETE FROM lgd_journal_attempts WHERE thread_id = ANY(ids);
    DELETE FROM lgd_repairs WHERE thread_id = ANY(ids);
END
$$;

-- strategy keep_latest, after the saver's prune_keep_latest statement (same transaction):
-- what the history took with it. The ledger rows of the runs tombstoned, their journal
-- attempts, chain slots of checkpoints gone, writes and journal rows of no checkpoint,
-- the backups, and the placeholder lease. Returns the footprint left.
CREATE OR REPLACE FUNCTION lgd_sweep_trim_v1(p_thread TEXT, p_token TEXT)
RETURNS TABLE (n_rows BIGINT, n_bytes BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    ids TEXT[];
BEGIN
    IF current_setting('lgd.sweep', true) IS DISTINCT FROM p_token THEN
        RETURN;  -- not claimed in this transaction: nothing to do
    END IF;
    SELECT coalesce(array_agg(DISTINCT r.backup_thread_id), '{}') INTO ids
    FROM lgd_repairs r WHERE r.thread_id = p_thread;
    DELETE FROM lgd_runs r USING lgd_swept_runs s
    WHERE r.thread_id = p_thread AND s.thread_id = p_thread AND s.run_id = r.run_id;
    DELETE FROM checkpoint_writes w
    WHERE w.thread_id = p_thread AND NOT EXISTS (
        SELECT 1 FROM checkpoints c WHERE c.thread_id = p_thread
          AND c.checkpoint_ns = w.checkpoint_ns AND c.checkpoint_id = w.checkpoint_id);
    DELETE FROM lgd_journal j
    WHERE j.thread_id = p_thread AND NOT EXISTS (
        SELECT 1 FROM checkpoints c WHERE c.thread_id = p_thread
          AND c.checkpoint_ns = j.checkpoint_ns AND c.checkpoint_id = j.checkpoint_id);
    DELETE FROM lgd_journal_attempts a
    WHERE a.thread_id = p_thread
      AND NOT EXISTS (SELECT 1 FROM lgd_runs r
                      WHERE r.thread_id = p_thread AND r.run_id = a.run_id)
      AND NOT EXISTS (SELECT 1 FROM lgd_journal j
                      WHERE j.thread_id = p_thread AND j.attempt = a.attempt);
    DELETE FROM lgd_chain ch
    WHERE ch.thread_id = p_thread AND NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.checkpoint_ns = ch.checkpoint_ns
          AND c.checkpoint_id = CASE WHEN ch.checkpoint_id LIKE 'refused:%'
                                     THEN split_part(ch.parent_checkpoint_id, '~', 1)
                                     ELSE ch.checkpoint_id END);
    DELETE FROM lgd_queue q WHERE q.thread_id = p_thread AND q.expires_at <= now();
    DELETE FROM lgd_leases l WHERE l.thread_id = p_thread AND l.attempt = p_token
                               AND l.run_id = 'lgd-sweep';
    IF cardinality(ids) > 0 THEN
        DELETE FROM checkpoints WHERE thread_id = ANY(ids);
        DELETE FROM checkpoint_blobs WHERE thread_id = ANY(ids);
        DELETE FROM checkpoint_writes WHERE thread_id = ANY(ids);
        DELETE FROM lgd_chain WHERE thread_id = ANY(ids);
        DELETE FROM lgd_runs WHERE thread_id = ANY(ids);
        DELETE FROM lgd_leases WHERE thread_id = ANY(ids);
        DELETE FROM lgd_journal WHERE thread_id = ANY(ids);
        DELETE FROM lgd_journal_attempts WHERE thread_id = ANY(ids);
        DELETE FROM lgd_repairs WHERE thread_id = p_thread;
    END IF;
    RETURN QUERY SELECT f.n_rows, f.n_bytes FROM lgd_thread_footprint_v1(ARRAY[p_thread]) f;
END
$$;
