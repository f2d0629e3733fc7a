-- Deliberate branches in every namespace a branching run writes. A graph run
-- addressed at a past checkpoint is a branch; its subgraphs continue their own
-- checkpoints (namespace 'child:<task>' or a stable one), whose child slots the first
-- run took already, at checkpoints the branch never addressed itself. lgd_guard_put_v5
-- differs from v3 only outside the root namespace: there a branch writer (p_branch)
-- claims its lineage slot ('<parent>~<run>') when the parent's slot is held by ANOTHER
-- run, the first checkpoint of a namespace included (parent ''); a slot held by another
-- attempt of the same run is a race, still refused (LG409); without run ids (policy
-- "warn") lineages are told apart by attempt. The root keeps v3's rule.
CREATE OR REPLACE FUNCTION lgd_guard_put_v5(
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
        IF p_branch AND slot = p_parent
           AND ((p_ns = '' AND p_parent <> '')
                OR (p_ns <> '' AND (taken.run_id IS DISTINCT FROM p_run
                                    OR (p_run IS NULL AND taken.attempt IS DISTINCT FROM p_attempt)))) THEN
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
CREATE OR REPLACE FUNCTION lgd_put_checkpoint_v5(
    p_thread TEXT, p_ns TEXT, p_id TEXT, p_parent TEXT, p_checkpoint JSONB, p_metadata JSONB,
    p_run TEXT, p_attempt TEXT, p_ledger BOOLEAN, p_fingerprint TEXT, p_branch BOOLEAN
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
    VALUES (p_thread, p_ns, p_id, p_parent, p_checkpoint, p_metadata)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
    DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    PERFORM lgd_guard_put_v5(p_thread, p_ns, coalesce(p_parent, ''), p_id, p_run, p_attempt,
                             p_ledger, p_fingerprint, p_branch);
END
$$;
