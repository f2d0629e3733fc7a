-- Runs on one thread: a lease per thread, a FIFO queue for multitask_strategy
-- "enqueue", the strategy and its outcome in the ledger, and _v3 functions that take,
-- renew, fence and release leases inside statements the saver already sends. New tables
-- and new function names only (plus two nullable columns on our own lgd_runs, added only
-- when missing): workers on older code keep calling the functions they know.

-- The lease of a thread: which run (and which attempt of it) holds the thread. Live while
-- ended IS NULL AND expires_at > now(). Taken when a graph run starts (lgd_admit_v3),
-- renewed by every checkpoint write of its run (lgd_put_checkpoint_v3) and by the saver's
-- heartbeat while a long node runs, released when the graph call returns
-- (lgd_release_v3; ended = 'ok', or 'error' when it raised). A crashed worker's lease
-- simply expires. The row stays after release: it is the thread's last holder.
CREATE TABLE IF NOT EXISTS lgd_leases (
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

-- Runs waiting for a thread under "enqueue", served in ticket order. A waiter renews its
-- ticket each time it looks again; a waiter that died stops renewing and is skipped.
CREATE TABLE IF NOT EXISTS lgd_queue (
    thread_id TEXT NOT NULL,
    ticket BIGSERIAL NOT NULL,
    run_id TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (thread_id, ticket)
);

-- The strategy a run was admitted under and what it did to the thread's previous run.
-- Read the catalog first: ADD COLUMN IF NOT EXISTS would take an exclusive lock even when
-- the column exists.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_name = 'lgd_runs' AND column_name = 'multitask_strategy'
                     AND table_schema = current_schema()) THEN
        ALTER TABLE lgd_runs ADD COLUMN multitask_strategy TEXT;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_name = 'lgd_runs' AND column_name = 'multitask_outcome'
                     AND table_schema = current_schema()) THEN
        ALTER TABLE lgd_runs ADD COLUMN multitask_outcome TEXT;
    END IF;
END
$$;

-- The NOTIFY channel of a thread's queue (identifiers are limited to 63 bytes).
CREATE OR REPLACE FUNCTION lgd_queue_channel_v3(p_thread TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$ SELECT 'lgd_q_' || left(md5(p_thread), 24) $$;

-- A run's checkpoints on one thread (every namespace), their pending writes, chain slots
-- and the blobs only they referenced, deleted; its ledger row kept as 'rolled_back'.
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

-- The admission decision of a graph run, taken when it loads its thread and before
-- LangGraph applies any input. Returns one row:
--   verdict: 'admitted' (the caller holds the lease now), 'busy' (another run holds a live
--            lease: nothing written, except the caller's queue ticket under "enqueue"),
--            'queued' (enqueue: the thread is free but an older ticket goes first) or
--            'unfinished' (the previous run stopped unfinished -- crashed, never retried
--            -- and the strategy neither continues on top of it nor rolls it back:
--            nothing written).
--   holder_*: the lease as it was before this call; outcome: how it was admitted.
-- Strategies (LangGraph Platform's names): reject, enqueue, interrupt, rollback. A retry
-- of the lease holder's own run (a new attempt) always takes the lease over: the
-- orchestrator decides retries; the old attempt is fenced as a zombie, as before.
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

-- Undo an admission the saver then refused for another reason (input mismatch, late
-- retry...): the lease goes back to exactly what it was, so a refused call leaves the
-- database as it found it. Only the refused attempt's own lease is touched.
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

-- The graph call of the lease holder returned (p_ended 'ok') or raised ('error'): free
-- the thread and wake the queue. A superseded attempt's release changes nothing.
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

-- Called (from the fenced pending-writes INSERT) only when another run holds a live lease
-- on the thread: the writer was interrupted or rolled back by that run.
CREATE OR REPLACE FUNCTION lgd_refuse_leased_v3(p_holder TEXT, p_outcome TEXT, p_thread TEXT)
RETURNS boolean LANGUAGE plpgsql COST 1000 AS $$
BEGIN
    RAISE EXCEPTION 'lgd: thread leased by another run'
        USING ERRCODE = 'LG413',
              DETAIL = format('run %s holds thread %s (%s)', p_holder, p_thread, p_outcome);
END
$$;

-- lgd_guard_put with the lease and deliberate branches:
-- * the write renews its run's lease and is refused (LG413) while another run holds a
--   live lease on the thread (it was interrupted or rolled back);
-- * p_branch: the writer addressed this parent on purpose (time travel, a fork,
--   update_state at a past checkpoint). When the parent's child slot is taken by another
--   writer, it claims the slot of its own lineage ('<parent>~<run or attempt>') instead:
--   one child per attempt lineage, so a deliberate branch is allowed while an attempt
--   that lost a race in the same lineage is still refused (LG409).
CREATE OR REPLACE FUNCTION lgd_guard_put_v3(
    p_thread TEXT, p_ns TEXT, p_parent TEXT, p_child TEXT, p_run TEXT, p_attempt TEXT,
    p_ledger BOOLEAN, p_fingerprint TEXT, p_branch BOOLEAN
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    taken lgd_chain;
    slot TEXT := p_parent;
    holder lgd_leases;
    parent_run TEXT;
    parent_cp JSONB;
    child_cp JSONB;
    child_source TEXT;
BEGIN
    IF p_parent <> '' AND p_child <= p_parent THEN
        RAISE EXCEPTION 'lgd: checkpoint id sorts before its parent'
            USING ERRCODE = 'LG411',
                  DETAIL = format('checkpoint %s continues %s', p_child, p_parent);
    END IF;
    -- The lease: renewed by its run's writes (the row lock also orders this write against
    -- an admission taking the thread over), refused while another run holds it.
    UPDATE lgd_leases l SET expires_at = now() + l.ttl
    WHERE l.thread_id = p_thread AND l.run_id = p_run AND l.ended IS NULL;
    IF NOT FOUND THEN
        SELECT * INTO holder FROM lgd_leases l
        WHERE l.thread_id = p_thread AND l.ended IS NULL AND l.expires_at > now()
          AND l.run_id IS DISTINCT FROM p_run;
        IF FOUND THEN
            RAISE EXCEPTION 'lgd: thread leased by another run'
                USING ERRCODE = 'LG413',
                      DETAIL = format('run %s holds thread %s (%s)', holder.run_id, p_thread,
                                      holder.outcome);
        END IF;
    END IF;
    LOOP
        INSERT INTO lgd_chain (thread_id, checkpoint_ns, parent_checkpoint_id, checkpoint_id, run_id, attempt)
        VALUES (p_thread, p_ns, slot, p_child, p_run, p_attempt)
        ON CONFLICT (thread_id, checkpoint_ns, parent_checkpoint_id) DO NOTHING;
        EXIT WHEN FOUND;
        SELECT * INTO taken FROM lgd_chain
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND parent_checkpoint_id = slot
        FOR UPDATE;
        IF taken.checkpoint_id LIKE 'refused:%' AND taken.attempt IS DISTINCT FROM p_attempt THEN
            UPDATE lgd_chain SET checkpoint_id = p_child, run_id = p_run, attempt = p_attempt
            WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND parent_checkpoint_id = slot;
            EXIT;
        END IF;
        EXIT WHEN taken.checkpoint_id IS NOT DISTINCT FROM p_child;
        IF p_branch AND slot = p_parent AND p_parent <> '' THEN
            slot := p_parent || '~' || coalesce(p_run, p_attempt, p_child);
            CONTINUE;
        END IF;
        RAISE EXCEPTION 'lgd: checkpoint already continued by another attempt'
            USING ERRCODE = 'LG409',
                  DETAIL = format('checkpoint %s in namespace %L was already continued by checkpoint %s of run %s',
                                  coalesce(nullif(p_parent, ''), '(none: first checkpoint)'), p_ns,
                                  taken.checkpoint_id, coalesce(taken.run_id, '(no run id)'));
    END LOOP;
    IF NOT p_ledger THEN
        RETURN;
    END IF;
    IF p_parent <> '' THEN
        SELECT c.metadata ->> 'run_id' INTO parent_run FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = p_parent;
        IF parent_run IS NOT NULL AND parent_run <> p_run AND NOT p_branch THEN
            SELECT c.checkpoint INTO parent_cp FROM checkpoints c
            WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = p_parent;
            SELECT c.checkpoint, c.metadata ->> 'source' INTO child_cp, child_source
            FROM checkpoints c
            WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = p_child;
            UPDATE lgd_runs SET
                status = CASE
                    WHEN child_source = 'input'
                     AND (parent_cp -> 'versions_seen') - '__interrupt__'
                         = (child_cp -> 'versions_seen') - '__interrupt__'
                     AND (parent_cp -> 'channel_versions' ->> '__pregel_tasks')
                         IS NOT DISTINCT FROM (child_cp -> 'channel_versions' ->> '__pregel_tasks')
                    THEN 'done' ELSE 'superseded' END,
                superseded_by = p_run,
                last_checkpoint_id = p_parent,
                updated_at = now()
            WHERE thread_id = p_thread AND run_id = parent_run
              AND status IN ('running', 'interrupted');
        END IF;
    END IF;
    INSERT INTO lgd_runs AS r (thread_id, run_id, status, attempts, last_attempt,
                               first_checkpoint_id, last_checkpoint_id, input_fingerprint,
                               multitask_strategy, multitask_outcome)
    SELECT p_thread, p_run, 'running', 1, p_attempt, p_child, p_child, p_fingerprint,
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
    WHERE r.last_attempt IS DISTINCT FROM EXCLUDED.last_attempt OR r.status <> 'running';
END
$$;

CREATE OR REPLACE FUNCTION lgd_put_checkpoint_v3(
    p_thread TEXT, p_ns TEXT, p_id TEXT, p_parent TEXT, p_checkpoint JSONB, p_metadata JSONB,
    p_run TEXT, p_attempt TEXT, p_ledger BOOLEAN, p_fingerprint TEXT, p_branch BOOLEAN
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
    VALUES (p_thread, p_ns, p_id, p_parent, p_checkpoint, p_metadata)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
    DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    PERFORM lgd_guard_put_v3(p_thread, p_ns, coalesce(p_parent, ''), p_id, p_run, p_attempt,
                             p_ledger, p_fingerprint, p_branch);
END
$$;
