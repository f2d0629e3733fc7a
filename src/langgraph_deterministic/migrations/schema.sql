-- The schema of a fresh install: what applying every migration in this directory to an
-- empty database leaves behind (tests/checkpointer/test_schema.py applies both and
-- compares the catalogs). Read it to see the whole schema in one place; the migrations
-- are how an existing database gets there. A new migration changes this file too.
--
-- Left out on purpose: the functions older versions of the library call, which the
-- migrations keep for workers still running them during a rolling deploy (a future post
-- migration drops them):
--   legacy: lgd_guard_put, lgd_guard_writes, lgd_refuse_writes, lgd_put_checkpoint,
--   legacy: lgd_guard_put_v3, lgd_put_checkpoint_v3, lgd_refuse_leased_v3,
--   legacy: lgd_guard_put_v5, lgd_put_checkpoint_v5
--   legacy: lgd_journal_store_v2
--   legacy: lgd_fence_writes_v6, lgd_refuse_v6

-- == The peer's tables (langgraph-checkpoint-postgres, its migration v9) ================

CREATE TABLE checkpoint_migrations (
    v INTEGER PRIMARY KEY
);
INSERT INTO checkpoint_migrations (v) SELECT generate_series(0, 9);

CREATE TABLE checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX checkpoints_thread_id_idx ON checkpoints (thread_id);
-- ours: list(filter={"run_id": ...}), delete_for_runs() and the ledger's reads
CREATE INDEX checkpoints_run_id_idx ON checkpoints ((metadata ->> 'run_id'))
    WHERE (metadata ->> 'run_id') IS NOT NULL;

CREATE TABLE checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);
CREATE INDEX checkpoint_blobs_thread_id_idx ON checkpoint_blobs (thread_id);
-- channel values compressed with lz4 where the server has it (migration 0018)
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 140000
       AND EXISTS (SELECT 1 FROM pg_settings
                   WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)) THEN
        EXECUTE 'ALTER TABLE checkpoint_blobs ALTER COLUMN blob SET COMPRESSION lz4';
    END IF;
END
$$;

CREATE TABLE checkpoint_writes (
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
CREATE INDEX checkpoint_writes_thread_id_idx ON checkpoint_writes (thread_id);
-- the checkpoint column and pending writes compressed with lz4 too (migration 0022)
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 140000
       AND EXISTS (SELECT 1 FROM pg_settings
                   WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)) THEN
        EXECUTE 'ALTER TABLE checkpoints ALTER COLUMN checkpoint SET COMPRESSION lz4';
        EXECUTE 'ALTER TABLE checkpoint_writes ALTER COLUMN blob SET COMPRESSION lz4';
    END IF;
END
$$;

-- == The retry contract: run ledger, checkpoint chain, thread leases ======================

-- One row per (thread, run). status (contract.RUN_STATUSES):
--   running      its latest write (it may have finished, be stopped in a node, or crashed)
--   interrupted  stopped at an interrupt
--   done         a later run started on its last checkpoint with nothing of it left to do
--   superseded   a later run moved the thread on before it finished
--   rolled_back  a later run (multitask_strategy "rollback") removed its checkpoints
CREATE TABLE lgd_runs (
    thread_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1,
    last_attempt TEXT,
    first_checkpoint_id TEXT NOT NULL,
    last_checkpoint_id TEXT NOT NULL,
    input_fingerprint TEXT,
    superseded_by TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    multitask_strategy TEXT,
    multitask_outcome TEXT,
    PRIMARY KEY (thread_id, run_id)
);
CREATE INDEX lgd_runs_run_id_idx ON lgd_runs (run_id);

-- At most one child per (checkpoint, attempt lineage): parent_checkpoint_id is the
-- parent's id ('' for a namespace's first checkpoint), or '<parent>~<run or attempt>' for
-- a deliberate branch; checkpoint_id 'refused:<attempt>' holds a slot against an attempt
-- refused for a duplicate Command.
CREATE TABLE lgd_chain (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    parent_checkpoint_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    run_id TEXT,
    attempt TEXT,
    PRIMARY KEY (thread_id, checkpoint_ns, parent_checkpoint_id)
);

-- The lease of a thread: live while ended IS NULL AND expires_at > now().
CREATE TABLE lgd_leases (
    thread_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    attempt TEXT NOT NULL,
    strategy TEXT NOT NULL,
    outcome TEXT NOT NULL,
    ttl INTERVAL NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    ended TEXT
);

-- Runs waiting for a thread under multitask_strategy "enqueue", in ticket order.
CREATE TABLE lgd_queue (
    thread_id TEXT NOT NULL,
    ticket BIGSERIAL NOT NULL,
    run_id TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (thread_id, ticket)
);

-- == The durable-op journal (PostgresJournal) ==============================================

CREATE TABLE lgd_journal (
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
CREATE INDEX lgd_journal_run_idx ON lgd_journal (run_id);

CREATE TABLE lgd_journal_attempts (
    thread_id TEXT NOT NULL,
    attempt TEXT NOT NULL,
    run_id TEXT,
    fenced_by TEXT,
    fenced_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, attempt)
);
CREATE INDEX lgd_journal_attempts_run_idx ON lgd_journal_attempts (run_id);

-- == Repairs (langgraph-deterministic repair --apply) ========================================

CREATE TABLE lgd_repairs (
    repair_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    faults TEXT[] NOT NULL,
    actions JSONB NOT NULL,
    old_head TEXT NOT NULL,
    new_head TEXT,
    backup_thread_id TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX lgd_repairs_thread_idx ON lgd_repairs (thread_id);

-- == Retention sweeps (saver.sweep, langgraph-deterministic prune) ======================

-- Tombstones of swept runs, kept for the policy's tombstone_ttl: a retry of one raises
-- RunSweptError instead of applying its input again.
CREATE TABLE lgd_swept_runs (
    thread_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    ledger_status TEXT NOT NULL,
    input_fingerprint TEXT,
    strategy TEXT NOT NULL,
    swept_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, run_id)
);
CREATE INDEX lgd_swept_runs_swept_at_idx ON lgd_swept_runs (swept_at);

-- One row per swept thread: time travel to a checkpoint the sweep removed names the sweep
-- (CheckpointPrunedError). Same retention as the runs' tombstones.
CREATE TABLE lgd_swept_threads (
    thread_id TEXT PRIMARY KEY,
    strategy TEXT NOT NULL,
    kept_checkpoint_id TEXT,
    swept_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX lgd_swept_threads_swept_at_idx ON lgd_swept_threads (swept_at);

-- == Functions ============================================================================
-- Each under the migration that added it, where its comments say why. The commit-time
-- arbitration of the retry contract is the _v6 group (0016_pre_arbitration_v6.sql), its
-- pending writes' fence the _v7 pair (0023_pre_pending_fence_v7.sql).

-- migration 0012_pre_durable_journal
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

-- migration 0012_pre_durable_journal
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

-- migration 0013_pre_journal_claim_ahead
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

-- migration 0020_pre_journal_store_v3
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

-- migration 0021_pre_journal_admit
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

-- migration 0021_pre_journal_admit
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

-- migration 0014_pre_thread_leases
CREATE OR REPLACE FUNCTION lgd_queue_channel_v3(p_thread TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$ SELECT 'lgd_q_' || left(md5(p_thread), 24) $$;

-- migration 0027_pre_rollback_guard
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

-- migration 0014_pre_thread_leases
CREATE OR REPLACE FUNCTION lgd_admit_v3(
    p_thread TEXT, p_run TEXT, p_attempt TEXT, p_strategy TEXT, p_ttl DOUBLE PRECISION,
    p_ticket BIGINT
) RETURNS TABLE (
    verdict TEXT, ticket BIGINT, holder_run TEXT, holder_attempt TEXT,
    holder_expires_at TIMESTAMPTZ, holder_ended TEXT, holder_strategy TEXT,
    holder_outcome TEXT, holder_acquired_at TIMESTAMPTZ, outcome TEXT
) LANGUAGE plpgsql AS $$
DECLARE
    cur lgd_leases;
    live BOOLEAN;
    prev_status TEXT;
    v_outcome TEXT;
    v_ticket BIGINT := p_ticket;
    ttl INTERVAL := make_interval(secs => p_ttl);
BEGIN
    SELECT * INTO cur FROM lgd_leases l WHERE l.thread_id = p_thread FOR UPDATE;
    IF NOT FOUND THEN
        -- First run on this thread (or a thread older than leases): claim it; a concurrent
        -- first run that inserted meanwhile makes this one look again, under the lock.
        INSERT INTO lgd_leases AS l (thread_id, run_id, attempt, strategy, outcome, ttl, expires_at)
        VALUES (p_thread, p_run, p_attempt, p_strategy, 'free', ttl, now() + ttl)
        ON CONFLICT (thread_id) DO NOTHING;
        IF FOUND THEN
            IF v_ticket IS NOT NULL THEN
                DELETE FROM lgd_queue q WHERE q.thread_id = p_thread AND q.ticket = v_ticket;
            END IF;
            RETURN QUERY SELECT 'admitted'::text, NULL::bigint, NULL::text, NULL::text,
                NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::timestamptz,
                'free'::text;
            RETURN;
        END IF;
        SELECT * INTO cur FROM lgd_leases l WHERE l.thread_id = p_thread FOR UPDATE;
    END IF;
    live := cur.ended IS NULL AND cur.expires_at > now();
    IF cur.run_id = p_run THEN
        v_outcome := CASE WHEN cur.attempt = p_attempt THEN cur.outcome ELSE 'retry' END;
    ELSIF live THEN
        IF p_strategy IN ('reject', 'enqueue') THEN
            IF p_strategy = 'enqueue' THEN
                IF v_ticket IS NULL THEN
                    INSERT INTO lgd_queue AS q (thread_id, run_id, expires_at)
                    VALUES (p_thread, p_run, now() + greatest(ttl, interval '5 seconds'))
                    RETURNING q.ticket INTO v_ticket;
                ELSE
                    UPDATE lgd_queue q SET expires_at = now() + greatest(ttl, interval '5 seconds')
                    WHERE q.thread_id = p_thread AND q.ticket = v_ticket;
                END IF;
            END IF;
            RETURN QUERY SELECT 'busy'::text, v_ticket, cur.run_id, cur.attempt, cur.expires_at,
                cur.ended, cur.strategy, cur.outcome, cur.acquired_at, NULL::text;
            RETURN;
        END IF;
        IF p_strategy = 'rollback' THEN
            PERFORM lgd_rollback_run_v3(p_thread, cur.run_id, p_run);
            v_outcome := 'rolled back ' || cur.run_id;
        ELSE
            UPDATE lgd_runs r SET status = 'superseded', superseded_by = p_run, updated_at = now()
            WHERE r.thread_id = p_thread AND r.run_id = cur.run_id AND r.status = 'running';
            v_outcome := 'interrupted ' || cur.run_id;
        END IF;
    ELSE
        -- Free: the previous holder returned, or its lease expired (it crashed).
        IF p_strategy = 'enqueue' THEN
            -- FIFO: an older live ticket goes first.
            DELETE FROM lgd_queue q WHERE q.thread_id = p_thread AND q.expires_at <= now();
            IF EXISTS (SELECT 1 FROM lgd_queue q WHERE q.thread_id = p_thread
                       AND (v_ticket IS NULL OR q.ticket < v_ticket)) THEN
                IF v_ticket IS NULL THEN
                    INSERT INTO lgd_queue AS q (thread_id, run_id, expires_at)
                    VALUES (p_thread, p_run, now() + greatest(ttl, interval '5 seconds'))
                    RETURNING q.ticket INTO v_ticket;
                ELSE
                    UPDATE lgd_queue q SET expires_at = now() + greatest(ttl, interval '5 seconds')
                    WHERE q.thread_id = p_thread AND q.ticket = v_ticket;
                END IF;
                RETURN QUERY SELECT 'queued'::text, v_ticket, cur.run_id, cur.attempt,
                    cur.expires_at, cur.ended, cur.strategy, cur.outcome, cur.acquired_at,
                    NULL::text;
                RETURN;
            END IF;
        END IF;
        v_outcome := CASE WHEN v_ticket IS NOT NULL THEN 'enqueued' ELSE 'free' END;
        IF cur.ended IS DISTINCT FROM 'ok' THEN
            -- It raised, or it died holding the lease. Unfinished unless it stopped at an
            -- interrupt (human in the loop) or a later write closed it.
            SELECT r.status INTO prev_status FROM lgd_runs r
            WHERE r.thread_id = p_thread AND r.run_id = cur.run_id;
            IF prev_status = 'running' THEN
                IF p_strategy = 'rollback' THEN
                    PERFORM lgd_rollback_run_v3(p_thread, cur.run_id, p_run);
                    v_outcome := 'rolled back ' || cur.run_id;
                ELSIF p_strategy = 'interrupt' THEN
                    v_outcome := 'continued after unfinished ' || cur.run_id;
                ELSE
                    RETURN QUERY SELECT 'unfinished'::text, v_ticket, cur.run_id, cur.attempt,
                        cur.expires_at, cur.ended, cur.strategy, cur.outcome,
                        cur.acquired_at, NULL::text;
                    RETURN;
                END IF;
            END IF;
        END IF;
    END IF;
    IF v_ticket IS NOT NULL THEN
        DELETE FROM lgd_queue q WHERE q.thread_id = p_thread AND q.ticket = v_ticket;
    END IF;
    UPDATE lgd_leases l SET run_id = p_run, attempt = p_attempt, strategy = p_strategy,
        outcome = v_outcome, ttl = make_interval(secs => p_ttl), acquired_at = now(),
        expires_at = now() + make_interval(secs => p_ttl), ended = NULL
    WHERE l.thread_id = p_thread;
    RETURN QUERY SELECT 'admitted'::text, v_ticket, cur.run_id, cur.attempt, cur.expires_at,
        cur.ended, cur.strategy, cur.outcome, cur.acquired_at, v_outcome;
END
$$;

-- migration 0014_pre_thread_leases
CREATE OR REPLACE FUNCTION lgd_unadmit_v3(
    p_thread TEXT, p_attempt TEXT, p_run TEXT, p_holder_attempt TEXT, p_expires TIMESTAMPTZ,
    p_ended TEXT, p_strategy TEXT, p_outcome TEXT, p_acquired TIMESTAMPTZ
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_run IS NULL THEN
        DELETE FROM lgd_leases WHERE thread_id = p_thread AND attempt = p_attempt;
    ELSE
        UPDATE lgd_leases SET run_id = p_run, attempt = p_holder_attempt, expires_at = p_expires,
            ended = p_ended, strategy = p_strategy, outcome = p_outcome, acquired_at = p_acquired
        WHERE thread_id = p_thread AND attempt = p_attempt;
    END IF;
END
$$;

-- migration 0014_pre_thread_leases
CREATE OR REPLACE FUNCTION lgd_release_v3(p_thread TEXT, p_attempt TEXT, p_ended TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE lgd_leases SET ended = p_ended, expires_at = now()
    WHERE thread_id = p_thread AND attempt = p_attempt AND ended IS NULL;
    IF FOUND AND EXISTS (SELECT 1 FROM lgd_queue WHERE thread_id = p_thread) THEN
        PERFORM pg_notify(lgd_queue_channel_v3(p_thread), '');
    END IF;
END
$$;

-- migration 0016_pre_arbitration_v6
CREATE OR REPLACE FUNCTION lgd_put_checkpoint_v6(
    p_thread TEXT, p_ns TEXT, p_id TEXT, p_parent TEXT, p_checkpoint JSONB, p_metadata JSONB,
    p_run TEXT, p_attempt TEXT, p_fingerprint TEXT, p_ledger BOOLEAN, p_branch BOOLEAN,
    p_closes TEXT, p_closes_run TEXT
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    parent TEXT := coalesce(p_parent, '');
    slot TEXT := coalesce(p_parent, '');
    taken lgd_chain;
    holder lgd_leases;
    closed TEXT := p_closes_run;
    run_status TEXT;
    run_attempt TEXT;
BEGIN
    IF parent <> '' AND p_id <= parent THEN
        RAISE EXCEPTION 'lgd: checkpoint id sorts before its parent'
            USING ERRCODE = 'LG411', DETAIL = format('checkpoint %s continues %s', p_id, parent);
    END IF;
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
    VALUES (p_thread, p_ns, p_id, p_parent, p_checkpoint, p_metadata)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
    DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;

    -- Lease: renewed by its own run's writes (the row lock also orders this write against
    -- an admission taking the thread over); refused while another run holds a live one.
    UPDATE lgd_leases l SET expires_at = now() + l.ttl
    WHERE l.thread_id = p_thread AND l.run_id = p_run AND l.ended IS NULL;
    IF NOT FOUND THEN
        SELECT * INTO holder FROM lgd_leases l
        WHERE l.thread_id = p_thread AND l.ended IS NULL AND l.expires_at > now()
          AND l.run_id IS DISTINCT FROM p_run;
        IF FOUND THEN
            RAISE EXCEPTION 'lgd: thread leased by another run'
                USING ERRCODE = 'LG413', DETAIL = format('run %s holds thread %s (%s)',
                                                         holder.run_id, p_thread, holder.outcome);
        END IF;
    END IF;

    -- One child per attempt lineage.
    LOOP
        INSERT INTO lgd_chain (thread_id, checkpoint_ns, parent_checkpoint_id, checkpoint_id, run_id, attempt)
        VALUES (p_thread, p_ns, slot, p_id, p_run, p_attempt)
        ON CONFLICT (thread_id, checkpoint_ns, parent_checkpoint_id) DO NOTHING;
        EXIT WHEN FOUND;
        SELECT * INTO taken FROM lgd_chain
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND parent_checkpoint_id = slot
        FOR UPDATE;
        EXIT WHEN taken.checkpoint_id IS NOT DISTINCT FROM p_id;  -- this write, again
        IF taken.checkpoint_id LIKE 'refused:%' AND taken.attempt IS DISTINCT FROM p_attempt THEN
            -- held for a refused attempt (LG412): it bars only that attempt
            UPDATE lgd_chain SET checkpoint_id = p_id, run_id = p_run, attempt = p_attempt
            WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND parent_checkpoint_id = slot;
            EXIT;
        END IF;
        IF p_branch AND slot = parent
           AND (p_ns = ''
                OR (p_ns <> '' AND (taken.run_id IS DISTINCT FROM p_run
                                    OR (p_run IS NULL AND taken.attempt IS DISTINCT FROM p_attempt)))) THEN
            slot := parent || '~' || coalesce(p_run, p_attempt, p_id);
            CONTINUE;
        END IF;
        RAISE EXCEPTION 'lgd: checkpoint already continued by another attempt'
            USING ERRCODE = 'LG409',
                  DETAIL = format('checkpoint %s in namespace %L was already continued by checkpoint %s of run %s',
                                  coalesce(nullif(parent, ''), '(none: first checkpoint)'), p_ns,
                                  taken.checkpoint_id, coalesce(taken.run_id, '(no run id)'));
    END LOOP;

    IF NOT p_ledger THEN
        RETURN;
    END IF;
    -- The run this write moves the thread on from: done or superseded, as the caller said.
    IF p_closes IS NOT NULL AND parent <> '' THEN
        IF closed IS NULL THEN
            SELECT c.metadata ->> 'run_id' INTO closed FROM checkpoints c
            WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = parent;
        END IF;
        IF closed IS DISTINCT FROM p_run THEN
            UPDATE lgd_runs SET status = p_closes, superseded_by = p_run,
                                last_checkpoint_id = parent, updated_at = now()
            WHERE thread_id = p_thread AND run_id = closed
              AND status IN ('running', 'interrupted');
        END IF;
    END IF;
    -- A later write of the same attempt changes nothing in its row (the usual case): one
    -- read, and no row lock, instead of the upsert below.
    SELECT r.status, r.last_attempt INTO run_status, run_attempt FROM lgd_runs r
    WHERE r.thread_id = p_thread AND r.run_id = p_run;
    IF FOUND AND run_status = 'running' AND run_attempt IS NOT DISTINCT FROM p_attempt THEN
        RETURN;
    END IF;
    INSERT INTO lgd_runs AS r (thread_id, run_id, status, attempts, last_attempt,
                               first_checkpoint_id, last_checkpoint_id, input_fingerprint,
                               multitask_strategy, multitask_outcome)
    SELECT p_thread, p_run, 'running', 1, p_attempt, p_id, p_id, p_fingerprint,
           l.strategy, l.outcome
    FROM (SELECT 1) AS one
    LEFT JOIN lgd_leases l ON l.thread_id = p_thread AND l.run_id = p_run
    ON CONFLICT (thread_id, run_id) DO UPDATE SET
        status = 'running',
        attempts = r.attempts
            + CASE WHEN r.last_attempt IS DISTINCT FROM EXCLUDED.last_attempt THEN 1 ELSE 0 END,
        last_attempt = EXCLUDED.last_attempt,
        last_checkpoint_id = EXCLUDED.last_checkpoint_id,
        input_fingerprint = coalesce(r.input_fingerprint, EXCLUDED.input_fingerprint),
        multitask_strategy = coalesce(EXCLUDED.multitask_strategy, r.multitask_strategy),
        multitask_outcome = coalesce(EXCLUDED.multitask_outcome, r.multitask_outcome),
        updated_at = now()
    -- The last checkpoint of a running run is its newest one (select_run reads it): it is
    -- recorded here only when the attempt or the status changes.
    WHERE r.last_attempt IS DISTINCT FROM EXCLUDED.last_attempt OR r.status <> 'running';
END
$$;

-- migration 0016_pre_arbitration_v6
CREATE OR REPLACE FUNCTION lgd_guard_writes_v6(
    p_thread TEXT, p_ns TEXT, p_checkpoint TEXT, p_run TEXT, p_command BOOLEAN,
    p_interrupted BOOLEAN
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_command AND EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_checkpoint
          AND (c.metadata ->> 'run_id') = p_run) THEN
        RAISE EXCEPTION 'lgd: command delivered twice'
            USING ERRCODE = 'LG412',
                  DETAIL = format('checkpoint %s was written by run %s itself', p_checkpoint, p_run);
    END IF;
    IF p_interrupted THEN
        UPDATE lgd_runs SET status = 'interrupted', last_checkpoint_id = p_checkpoint,
                            updated_at = now()
        WHERE thread_id = p_thread AND run_id = p_run AND status = 'running';
    END IF;
END
$$;

-- migration 0024_pre_contract_v4
CREATE OR REPLACE FUNCTION lgd_wake_queue_v4(p_thread TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first_ticket BIGINT;
BEGIN
    SELECT min(q.ticket) INTO first_ticket FROM lgd_queue q
    WHERE q.thread_id = p_thread AND q.expires_at > now();
    IF first_ticket IS NOT NULL THEN
        PERFORM pg_notify('lgd_queue', lgd_queue_channel_v3(p_thread) || ' ' || first_ticket);
        PERFORM pg_notify(lgd_queue_channel_v3(p_thread), '');
    END IF;
END
$$;

-- migration 0024_pre_contract_v4
CREATE OR REPLACE FUNCTION lgd_admit_v4(
    p_thread TEXT, p_run TEXT, p_attempt TEXT, p_strategy TEXT, p_ttl DOUBLE PRECISION,
    p_ticket BIGINT
) RETURNS TABLE (
    verdict TEXT, ticket BIGINT, holder_run TEXT, holder_attempt TEXT,
    holder_expires_at TIMESTAMPTZ, holder_ended TEXT, holder_strategy TEXT,
    holder_outcome TEXT, holder_acquired_at TIMESTAMPTZ, outcome TEXT
) LANGUAGE plpgsql AS $$
DECLARE
    cur lgd_leases;
BEGIN
    SELECT * INTO cur FROM lgd_leases l WHERE l.thread_id = p_thread FOR UPDATE;
    IF FOUND AND cur.run_id = p_run AND cur.ended = 'ok' THEN
        IF p_ticket IS NOT NULL THEN
            DELETE FROM lgd_queue q WHERE q.thread_id = p_thread AND q.ticket = p_ticket;
        END IF;
        RETURN QUERY SELECT 'admitted'::text, p_ticket, cur.run_id, cur.attempt,
            cur.expires_at, cur.ended, cur.strategy, cur.outcome, cur.acquired_at,
            'finished'::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM lgd_admit_v3(p_thread, p_run, p_attempt, p_strategy, p_ttl,
                                            p_ticket);
END
$$;

-- migration 0024_pre_contract_v4
CREATE OR REPLACE FUNCTION lgd_journal_admit_v2(
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
    SELECT * INTO adm FROM lgd_admit_v4(p_thread, p_run, p_attempt, p_strategy, p_ttl,
                                        p_ticket) AS x;
    IF adm.verdict = 'admitted' AND adm.outcome IS DISTINCT FROM 'finished' THEN
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

-- migration 0024_pre_contract_v4
CREATE OR REPLACE FUNCTION lgd_release_v4(
    p_thread TEXT, p_run TEXT, p_attempt TEXT, p_ended TEXT
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_ended = 'ok' THEN
        UPDATE lgd_leases SET ended = 'ok', expires_at = now()
        WHERE thread_id = p_thread AND run_id = p_run AND ended IS DISTINCT FROM 'ok';
    ELSIF p_ended = 'lost' THEN
        RETURN;
    ELSE
        UPDATE lgd_leases SET ended = p_ended, expires_at = now()
        WHERE thread_id = p_thread AND attempt = p_attempt AND ended IS NULL;
    END IF;
    IF FOUND AND EXISTS (SELECT 1 FROM lgd_queue WHERE thread_id = p_thread) THEN
        PERFORM lgd_wake_queue_v4(p_thread);
    END IF;
END
$$;

-- migration 0024_pre_contract_v4
CREATE OR REPLACE FUNCTION lgd_unadmit_v4(
    p_thread TEXT, p_attempt TEXT, p_run TEXT, p_holder_attempt TEXT, p_expires TIMESTAMPTZ,
    p_ended TEXT, p_strategy TEXT, p_outcome TEXT, p_acquired TIMESTAMPTZ
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lgd_unadmit_v3(p_thread, p_attempt, p_run, p_holder_attempt, p_expires, p_ended,
                           p_strategy, p_outcome, p_acquired);
    IF EXISTS (SELECT 1 FROM lgd_queue WHERE thread_id = p_thread) THEN
        PERFORM lgd_wake_queue_v4(p_thread);
    END IF;
END
$$;

-- migration 0023_pre_pending_fence_v7
CREATE OR REPLACE FUNCTION lgd_fence_writes_v7(
    p_child TEXT, p_child_run TEXT, p_child_attempt TEXT, p_attempt TEXT, p_checkpoint TEXT,
    p_ns TEXT
) RETURNS boolean LANGUAGE plpgsql COST 1000 AS $$
BEGIN
    IF p_child_attempt IS NOT DISTINCT FROM p_attempt AND p_child LIKE 'refused:%' THEN
        RAISE EXCEPTION 'lgd: command delivered twice'
            USING ERRCODE = 'LG412',
                  DETAIL = format('this attempt was refused at checkpoint %s', p_checkpoint);
    END IF;
    IF p_child_attempt IS NOT DISTINCT FROM p_attempt OR p_child LIKE 'refused:%' THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'lgd: checkpoint already continued by another attempt'
        USING ERRCODE = 'LG410',
              DETAIL = format('checkpoint %s in namespace %L was already continued by checkpoint %s of run %s',
                              p_checkpoint, p_ns, p_child, coalesce(p_child_run, '(no run id)'));
END
$$;

-- migration 0023_pre_pending_fence_v7
CREATE OR REPLACE FUNCTION lgd_refuse_leased_v7(p_holder TEXT, p_thread TEXT, p_outcome TEXT)
RETURNS boolean LANGUAGE plpgsql COST 1000 AS $$
BEGIN
    RAISE EXCEPTION 'lgd: thread leased by another run'
        USING ERRCODE = 'LG413',
              DETAIL = format('run %s holds thread %s (%s)', p_holder, p_thread, p_outcome);
END
$$;

-- migration 0025_pre_lost_writes
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

-- migration 0025_pre_lost_writes
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

-- == Versions =============================================================================

CREATE TABLE langgraph_deterministic_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    phase TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO langgraph_deterministic_migrations (version, name, phase) VALUES
    (1, 'checkpoint_tables', 'pre'),
    (2, 'thread_indexes', 'pre'),
    (3, 'run_id_index', 'pre'),
    (4, 'run_ledger', 'pre'),
    (5, 'guarded_put', 'pre'),
    (6, 'run_ledger_run_index', 'pre'),
    (12, 'durable_journal', 'pre'),
    (13, 'journal_claim_ahead', 'pre'),
    (14, 'thread_leases', 'pre'),
    (15, 'subgraph_branches', 'pre'),
    (16, 'arbitration_v6', 'pre'),
    (17, 'repair_log', 'pre'),
    (18, 'blob_lz4', 'pre'),
    (20, 'journal_store_v3', 'pre'),
    (21, 'journal_admit', 'pre'),
    (22, 'lz4_checkpoints_writes', 'pre'),
    (23, 'pending_fence_v7', 'pre'),
    (24, 'contract_v4', 'pre'),
    (25, 'lost_writes', 'pre'),
    (26, 'retention', 'pre'),
    (27, 'rollback_guard', 'pre');

-- migration 0026_pre_retention
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

-- migration 0026_pre_retention
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

-- migration 0026_pre_retention
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

-- migration 0026_pre_retention
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
