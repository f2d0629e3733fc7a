-- The retry contract: the run ledger, the chain of checkpoints that fences off zombie
-- attempts, and the two guard functions every checkpoint write calls in its own
-- transaction. New tables and functions only: nothing of the peer's tables is touched,
-- nothing is rewritten, no lock is taken on an existing table.

-- One row per (thread, run): what the run did, maintained in the same transaction as the
-- run's root-namespace checkpoint writes.
--   status: running | interrupted | done | superseded
--     done       a later run started on this run's last checkpoint with no task of this
--                run left to do (LangGraph discarded nothing): the run had finished.
--     superseded a later run moved the thread on before this one finished.
CREATE TABLE IF NOT EXISTS lgd_runs (
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
    PRIMARY KEY (thread_id, run_id)
);

-- At most one child per checkpoint: the key makes Postgres the arbiter between two
-- attempts that continue the same checkpoint (a zombie and its retry, or two runs), on
-- any number of machines. parent_checkpoint_id '' stands for "first checkpoint of the
-- namespace". attempt is the token the saver handed the writing graph run.
CREATE TABLE IF NOT EXISTS lgd_chain (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    parent_checkpoint_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    run_id TEXT,
    attempt TEXT,
    PRIMARY KEY (thread_id, checkpoint_ns, parent_checkpoint_id)
);

-- Called in the transaction of every checkpoint write (policy require/warn), after the
-- checkpoint row is inserted (a failure rolls everything back).
-- Claims the parent's one child slot or raises LG409; for a root-namespace write of a
-- run, records the run in the ledger and closes the previous run (done or superseded).
CREATE OR REPLACE FUNCTION lgd_guard_put(
    p_thread TEXT, p_ns TEXT, p_parent TEXT, p_child TEXT, p_run TEXT, p_attempt TEXT,
    p_ledger BOOLEAN, p_fingerprint TEXT
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    taken lgd_chain;
    parent_run TEXT;
    parent_cp JSONB;
    child_cp JSONB;
    child_source TEXT;
BEGIN
    -- LangGraph's "latest checkpoint" is the greatest id: a child that sorts before its
    -- parent (a writer whose clock is behind) would be stored but never loaded.
    IF p_parent <> '' AND p_child <= p_parent THEN
        RAISE EXCEPTION 'lgd: checkpoint id sorts before its parent'
            USING ERRCODE = 'LG411',
                  DETAIL = format('checkpoint %s continues %s', p_child, p_parent);
    END IF;
    INSERT INTO lgd_chain (thread_id, checkpoint_ns, parent_checkpoint_id, checkpoint_id, run_id, attempt)
    VALUES (p_thread, p_ns, p_parent, p_child, p_run, p_attempt)
    ON CONFLICT (thread_id, checkpoint_ns, parent_checkpoint_id) DO NOTHING;
    IF NOT FOUND THEN
        SELECT * INTO taken FROM lgd_chain
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND parent_checkpoint_id = p_parent
        FOR UPDATE;
        IF taken.checkpoint_id LIKE 'refused:%' AND taken.attempt IS DISTINCT FROM p_attempt THEN
            -- A slot held for a refused attempt (see lgd_guard_writes) bars only that
            -- attempt; anyone else continues the checkpoint normally.
            UPDATE lgd_chain SET checkpoint_id = p_child, run_id = p_run, attempt = p_attempt
            WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND parent_checkpoint_id = p_parent;
        ELSIF taken.checkpoint_id IS DISTINCT FROM p_child THEN
            RAISE EXCEPTION 'lgd: checkpoint already continued by another attempt'
                USING ERRCODE = 'LG409',
                      DETAIL = format('checkpoint %s in namespace %L was already continued by checkpoint %s of run %s',
                                      coalesce(nullif(p_parent, ''), '(none: first checkpoint)'), p_ns,
                                      taken.checkpoint_id, coalesce(taken.run_id, '(no run id)'));
        END IF;
    END IF;
    IF NOT p_ledger THEN
        RETURN;
    END IF;
    IF p_parent <> '' THEN
        -- Who wrote the parent (its small metadata only: the checkpoint itself is read
        -- only when the parent belongs to another run).
        SELECT c.metadata ->> 'run_id' INTO parent_run FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = p_parent;
        IF parent_run IS NOT NULL AND parent_run <> p_run THEN
            SELECT c.checkpoint INTO parent_cp FROM checkpoints c
            WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = p_parent;
            -- The new checkpoint was inserted earlier in this transaction.
            SELECT c.checkpoint, c.metadata ->> 'source' INTO child_cp, child_source
            FROM checkpoints c
            WHERE c.thread_id = p_thread AND c.checkpoint_ns = '' AND c.checkpoint_id = p_child;
            -- LangGraph discards the unfinished tasks of the previous run when a new
            -- input arrives, which changes versions_seen (or clears pending Sends): equal
            -- means nothing was left to do, i.e. the previous run had finished.
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
                               first_checkpoint_id, last_checkpoint_id, input_fingerprint)
    VALUES (p_thread, p_run, 'running', 1, p_attempt, p_child, p_child, p_fingerprint)
    ON CONFLICT (thread_id, run_id) DO UPDATE SET
        status = 'running',
        attempts = r.attempts
            + CASE WHEN r.last_attempt IS DISTINCT FROM EXCLUDED.last_attempt THEN 1 ELSE 0 END,
        last_attempt = EXCLUDED.last_attempt,
        last_checkpoint_id = EXCLUDED.last_checkpoint_id,
        input_fingerprint = coalesce(r.input_fingerprint, EXCLUDED.input_fingerprint),
        updated_at = now()
    -- A run's later checkpoints change nothing here (no new row version per write): the
    -- last checkpoint of a running run is its newest one (see select_run); it is
    -- recorded when the run's attempt or status changes, and when a later run closes it.
    WHERE r.last_attempt IS DISTINCT FROM EXCLUDED.last_attempt OR r.status <> 'running';
END
$$;

-- Called in the transaction of a Command's writes and of interrupt writes (policy
-- require/warn): raises LG412 when a run re-applies its own Command on a checkpoint it
-- wrote after applying it (a duplicate delivery); records interrupts in the ledger.
-- After LG412 the saver holds the checkpoint's child slot for the refused attempt
-- ('refused:<attempt>', query refuse_attempt), so that attempt can store nothing more
-- from it, while any other attempt or run continues the checkpoint as usual.
CREATE OR REPLACE FUNCTION lgd_guard_writes(
    p_thread TEXT, p_ns TEXT, p_checkpoint TEXT, p_attempt TEXT, p_run TEXT,
    p_command BOOLEAN, p_interrupted BOOLEAN
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cp_run TEXT;
BEGIN
    IF p_command THEN
        SELECT c.metadata ->> 'run_id' INTO cp_run FROM checkpoints c
        WHERE c.thread_id = p_thread AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_checkpoint;
        IF cp_run = p_run THEN
            RAISE EXCEPTION 'lgd: command delivered twice'
                USING ERRCODE = 'LG412',
                      DETAIL = format('checkpoint %s was written by run %s itself', p_checkpoint, p_run);
        END IF;
    END IF;
    IF p_interrupted THEN
        UPDATE lgd_runs SET status = 'interrupted', last_checkpoint_id = p_checkpoint,
                            updated_at = now()
        WHERE thread_id = p_thread AND run_id = p_run AND status = 'running';
    END IF;
END
$$;

-- Called by the pending-writes INSERT only for a checkpoint that already has a child, i.e.
-- almost never: returns false when the writer may still write (its own attempt's late
-- writes, or a slot held for another, refused attempt), raises otherwise: LG410 when
-- another attempt continued the checkpoint (a zombie or the loser of a race), LG412 when
-- this attempt was refused for a duplicate Command.
CREATE OR REPLACE FUNCTION lgd_refuse_writes(
    p_child TEXT, p_child_run TEXT, p_child_attempt TEXT, p_attempt TEXT, p_checkpoint TEXT,
    p_ns TEXT
) RETURNS boolean LANGUAGE plpgsql COST 1000 AS $$
BEGIN
    IF p_child LIKE 'refused:%' THEN
        IF p_child_attempt IS NOT DISTINCT FROM p_attempt THEN
            RAISE EXCEPTION 'lgd: command delivered twice'
                USING ERRCODE = 'LG412',
                      DETAIL = format('this attempt was refused at checkpoint %s', p_checkpoint);
        END IF;
        RETURN false;
    END IF;
    IF p_child_attempt IS NOT DISTINCT FROM p_attempt THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'lgd: checkpoint already continued by another attempt'
        USING ERRCODE = 'LG410',
              DETAIL = format('checkpoint %s in namespace %L was already continued by checkpoint %s of run %s',
                              p_checkpoint, p_ns, p_child, coalesce(p_child_run, '(no run id)'));
END
$$;
