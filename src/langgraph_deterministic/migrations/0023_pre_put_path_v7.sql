-- The put path of the retry contract with less server work per superstep (issue 13): the
-- same arbitration as lgd_put_checkpoint_v6 (migration 0016, whose comments say what each
-- check protects), with
-- * the lease locked instead of renewed by every write. A renewal is a new version of the
--   lease row each superstep (its WAL, a HOT chain for the next write to walk, pruning
--   later); a row lock in the mode the renewal's UPDATE took (so it waits for and blocks
--   exactly what that did: an admission's FOR UPDATE, a release, the heartbeat, another
--   write of the run) only marks the row. The lease is renewed once less than half its
--   ttl remains: after any write of its run it has at least ttl/2 to live, and the
--   saver's heartbeat (every ttl/3) keeps it alive between;
-- * a ledger write's read of its run's row in the lease's statement (one statement less);
-- * the pending writes' fence refusals in plpgsql (lgd_fence_writes_v7 below).
-- Measured: benchmarks/README.md (ab_put_path.py --replay, callgrind). New names only:
-- workers of older versions keep calling lgd_put_checkpoint_v6.

CREATE OR REPLACE FUNCTION lgd_put_checkpoint_v7(
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
    lease_expires TIMESTAMPTZ;
    lease_ttl INTERVAL;
    leased BOOLEAN;
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

    -- Lease: locked by its own run's writes (the row lock orders this write against an
    -- admission taking the thread over: lgd_admit_v3 locks the row first), renewed only
    -- once less than half its ttl remains; refused while another run holds a live one.
    -- A ledger write (p_ledger) reads its run's row in the same statement: under the lock
    -- no admission, and no write of its own run, can change that row before this commits
    -- (as late as v6 read it, a write of another run closing it may or may not land
    -- first, as then).
    IF p_ledger THEN
        SELECT l.expires_at, l.ttl, r.status, r.last_attempt
        INTO lease_expires, lease_ttl, run_status, run_attempt
        FROM lgd_leases l
        LEFT JOIN lgd_runs r ON r.thread_id = p_thread AND r.run_id = p_run
        WHERE l.thread_id = p_thread AND l.run_id = p_run AND l.ended IS NULL
        FOR NO KEY UPDATE OF l;
    ELSE
        SELECT l.expires_at, l.ttl INTO lease_expires, lease_ttl FROM lgd_leases l
        WHERE l.thread_id = p_thread AND l.run_id = p_run AND l.ended IS NULL
        FOR NO KEY UPDATE;
    END IF;
    leased := FOUND;
    IF leased THEN
        IF lease_expires < now() + lease_ttl / 2 THEN
            UPDATE lgd_leases l SET expires_at = now() + l.ttl WHERE l.thread_id = p_thread;
        END IF;
    ELSE
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
    -- read (with the lease's above, when the run holds it), and no row lock, instead of
    -- the upsert below.
    IF NOT leased THEN
        SELECT r.status, r.last_attempt INTO run_status, run_attempt FROM lgd_runs r
        WHERE r.thread_id = p_thread AND r.run_id = p_run;
    END IF;
    IF run_status = 'running' AND run_attempt IS NOT DISTINCT FROM p_attempt THEN
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

-- The fence of a pending write (as lgd_fence_writes_v6, called only for a checkpoint whose
-- slot in the writer's lineage is held already), in plpgsql: v6 is an SQL function that
-- Postgres inlines, so every pending-write statement compiled its whole CASE (two
-- refusals, two format() calls) before running, though the row it tests almost never
-- exists; a call of this one is a single function to set up.
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

-- The lease refusal of a pending write (another run holds a live lease on the thread),
-- called only then: one function to set up per statement instead of a refusal and a
-- format() call.
CREATE OR REPLACE FUNCTION lgd_refuse_leased_v7(p_holder TEXT, p_thread TEXT, p_outcome TEXT)
RETURNS boolean LANGUAGE plpgsql COST 1000 AS $$
BEGIN
    RAISE EXCEPTION 'lgd: thread leased by another run'
        USING ERRCODE = 'LG413',
              DETAIL = format('run %s holds thread %s (%s)', p_holder, p_thread, p_outcome);
END
$$;
