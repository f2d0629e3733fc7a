-- The commit-time arbitration of the retry contract, in one file. Every
-- function here runs inside the transaction of the write it guards, so a refusal rolls
-- the write back. What needs LangGraph's checkpoint format (did a new run find the
-- previous one finished?) is decided in Python and arrives as a plain parameter; what
-- stays here is only what must hold across processes at commit time:
--
--   one child per attempt lineage  lgd_chain's key: two attempts can never both extend
--                                  the same checkpoint (LG409), a deliberate branch
--                                  takes its own lineage slot '<parent>~<run>';
--   stale attempts fenced          pending writes to a checkpoint another attempt moved
--                                  past are refused (LG410);
--   checkpoint ids move forward    a child id sorting before its parent's (LG411);
--   a Command applies once         a run's Command on a checkpoint it wrote itself (LG412);
--   leases                         a write renews its run's lease, and is refused while
--                                  another run holds a live one (LG413);
--   ledger transitions             lgd_runs.status: running -> interrupted, and
--                                  running | interrupted -> done | superseded when a
--                                  later run moves the thread on (rolled_back: 0014).
--
-- The status names and LG4xx codes are defined once in Python (contract.py); a test
-- parses this file and checks that every one used here is known there.
-- New names only (_v6): workers of older versions keep calling the functions of
-- migrations 0004, 0005, 0014 and 0015, which stay as they are.

-- A refusal, raised from plain SQL statements (a WHERE clause calls it only on the row
-- that refuses): COST 1000 makes the planner evaluate it after every cheaper condition.
CREATE OR REPLACE FUNCTION lgd_refuse_v6(p_code TEXT, p_message TEXT, p_detail TEXT)
RETURNS boolean LANGUAGE plpgsql COST 1000 AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = p_code, DETAIL = p_detail;
END
$$;

-- A checkpoint write of a guarded run, in one statement: the checkpoint upsert, the lease,
-- the parent's child slot, and (p_ledger: a root-namespace write with a run id) the ledger.
--   p_branch       the writer continues p_parent on purpose (time travel, a fork,
--                  update_state at a past checkpoint): it may take its lineage slot when
--                  the parent's slot is held by another writer (outside the root
--                  namespace: by another run; inside: by anyone, a first checkpoint
--                  included: update_state(..., as_node="__copy__") of a thread's first
--                  checkpoint starts a second root).
--   p_closes       what this write makes of the run that wrote p_parent, if another run
--                  did: 'done' or 'superseded' (decided by the caller from LangGraph's
--                  checkpoints), NULL when it closes nothing.
--   p_closes_run   that run, when the caller knows it; NULL: the parent's run_id metadata.
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

-- Pending writes of a Command (p_command) or an interrupt (p_interrupted) of a root run,
-- sent before the writes in the same transaction: a run re-applying its own Command on a
-- checkpoint it wrote after applying it is a duplicate delivery (LG412); an interrupt
-- moves the run from running to interrupted.
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

-- The fence of a pending write, called (from the guarded pending-writes INSERT) only for
-- a checkpoint whose slot in the writer's lineage is held already, i.e. almost never.
-- false: the writer may still write (its own attempt's late writes, or a slot held for
-- another, refused attempt); otherwise it raises: LG412 for the refused attempt itself,
-- LG410 for any other attempt (a zombie, or the loser of a race).
CREATE OR REPLACE FUNCTION lgd_fence_writes_v6(
    p_child TEXT, p_child_run TEXT, p_child_attempt TEXT, p_attempt TEXT, p_checkpoint TEXT,
    p_ns TEXT
) RETURNS boolean LANGUAGE sql COST 1000 AS $$
    SELECT CASE
        WHEN p_child_attempt IS NOT DISTINCT FROM p_attempt AND p_child LIKE 'refused:%'
            THEN lgd_refuse_v6('LG412', 'lgd: command delivered twice',
                               format('this attempt was refused at checkpoint %s', p_checkpoint))
        WHEN p_child_attempt IS NOT DISTINCT FROM p_attempt OR p_child LIKE 'refused:%'
            THEN false
        ELSE lgd_refuse_v6('LG410', 'lgd: checkpoint already continued by another attempt',
                           format('checkpoint %s in namespace %L was already continued by checkpoint %s of run %s',
                                  p_checkpoint, p_ns, p_child, coalesce(p_child_run, '(no run id)')))
    END
$$;
