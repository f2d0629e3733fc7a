-- Leases that tell the truth after races, late retries and bursts. New names only: workers
-- of older versions keep calling the _v3 functions (migration 0014), on the same rows.
--
-- * A finished run stays finished: a retry of the run whose graph call returned (its
--   lease ended 'ok', no later run took the thread) is admitted without taking the
--   lease. It has nothing left to do (LangGraph finds its own run at the head, or the
--   saver hands it the run's final checkpoint); whatever happens to it - cancelled,
--   killed, failing - it cannot leave the thread busy or its run looking unfinished.
-- * Of two attempts of one run, the one whose call returns ends the lease 'ok', whichever
--   attempt the lease names (the other took it over, or was taken over): its call
--   returning means it stored the run's chain. An attempt that lost a race to another
--   attempt of its own run ends nothing ('lost'): the winner holds the thread on.
-- * Waiters of "enqueue" hear a release on one channel, 'lgd_queue', whose payload names
--   the thread's channel and its first live ticket: a process listens once, on a
--   connection of its own, and wakes only the waiter whose turn it is. The thread's own
--   channel (lgd_queue_channel_v3) is notified too, for waiters of older versions.

-- Wake the queue of a thread (called when its lease ends, if anyone waits).
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

-- lgd_admit_v3, except for a retry of a finished run: the thread's lease is that run's
-- and ended 'ok'. The retry is admitted ('admitted', outcome 'finished') and the lease
-- is left as it is (a queue ticket it held is dropped).
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

-- lgd_journal_admit_v1 over lgd_admit_v4. A finished run's retry registers nothing in the
-- journal (fence_at NULL): it has no op left to run, and must not fence off anyone.
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

-- The graph call of an attempt of run p_run returned ('ok'), raised ('error') or lost a
-- race to another attempt of its own run ('lost'):
-- * 'ok' ends the run's lease whichever attempt of the run it names;
-- * 'error' ends it only if this attempt holds it (a superseded attempt changes nothing);
-- * 'lost' changes nothing: the attempt that won holds the thread on.
-- The queue is woken when the lease ends.
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

-- An admitted attempt whose call raised before it stored anything: its admission undone
-- (lgd_unadmit_v3: the lease as it was, or no lease row if there was none), and the queue
-- woken, as a release would. A refused input leaves no row behind.
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
