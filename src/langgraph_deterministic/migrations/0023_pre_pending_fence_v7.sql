-- The pending writes' fence with less server work per statement: every
-- guarded pending-write statement (queries.sql guarded_writes / guarded_write) tests the
-- writer's chain slot and the thread's lease with a refusal that runs only on the row that
-- refuses, i.e. almost never. v6's refusals are an SQL function that Postgres inlines
-- (lgd_fence_writes_v6: a CASE with two refusals and two format() calls) and a refusal
-- with a format() call: each statement set all of it up at executor start (a function's
-- lookup and permission check each) before testing a row. Here each is one plpgsql call,
-- never inlined, with the same errors (measured: the server's instructions per graph run,
-- under callgrind). New names only: workers of older versions keep sending
-- their own statements, which call the _v6 functions (migration 0016).

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
