-- Named queries of DeterministicSaver. Each block starts with `-- name: <key>` and runs
-- with psycopg's %(name)s placeholders. The layout is langgraph-checkpoint-postgres's.

-- name: select_checkpoint
-- One checkpoint with its blobs and its pending writes, in one round trip. The blob and
-- write columns are parallel arrays, so the row maps to a CheckpointTuple without a
-- second query. Writes come back unsorted; the core sorts them by writes_sort_key.
-- Each blob is one primary-key lookup (OFFSET 0 keeps the planner from turning the
-- lookups into a join): with the thread's and namespace's selectivities multiplied, the
-- planner would otherwise estimate one blob per thread and hash them all, every blob of
-- the thread for every checkpoint read, which grows with the thread.
SELECT
    c.thread_id,
    c.checkpoint_ns,
    c.checkpoint_id,
    c.parent_checkpoint_id,
    c.checkpoint,
    c.metadata,
    b.channels, b.types, b.blobs,
    w.task_ids, w.channels AS w_channels, w.types AS w_types, w.blobs AS w_blobs,
    w.task_paths, w.idxs
FROM checkpoints c
LEFT JOIN LATERAL (
    SELECT array_agg(bl.channel) AS channels, array_agg(bl.type) AS types,
           array_agg(bl.blob) AS blobs
    -- (guarded: a row whose versions are not an object reads as unreadable, not an SQL error)
    FROM jsonb_each_text(CASE WHEN jsonb_typeof(c.checkpoint -> 'channel_versions') = 'object' THEN c.checkpoint -> 'channel_versions' END) AS v
    CROSS JOIN LATERAL (
        SELECT k.channel, k.type, k.blob FROM checkpoint_blobs k
        WHERE k.thread_id = c.thread_id AND k.checkpoint_ns = c.checkpoint_ns
          AND k.channel = v.key AND k.version = v.value
        OFFSET 0
    ) bl
) b ON true
LEFT JOIN LATERAL (
    SELECT array_agg(cw.task_id) AS task_ids, array_agg(cw.channel) AS channels,
           array_agg(cw.type) AS types, array_agg(cw.blob) AS blobs,
           array_agg(cw.task_path) AS task_paths, array_agg(cw.idx) AS idxs
    FROM checkpoint_writes cw
    WHERE cw.thread_id = c.thread_id AND cw.checkpoint_ns = c.checkpoint_ns
      AND cw.checkpoint_id = c.checkpoint_id
) w ON true

-- name: list_page
-- The checkpoints one list() call returns, before their blobs and writes are joined to
-- them (see _statements._list_sql). A NULL parameter drops its condition: sent unprepared, the
-- statement is planned with its values, so the planner folds each `NULL IS NULL OR ...`
-- away and the remaining conditions use their indexes (tests/checkpointer/test_plans.py).
-- run_id repeats the filter's run id as text, so that checkpoints_run_id_idx serves it;
-- the @> keeps the filter's exact semantics. LIMIT NULL is no limit.
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
       c.checkpoint, c.metadata
FROM checkpoints c
WHERE (%(thread_id)s::text IS NULL OR c.thread_id = %(thread_id)s::text)
  AND (%(checkpoint_ns)s::text IS NULL OR c.checkpoint_ns = %(checkpoint_ns)s::text)
  AND (%(checkpoint_id)s::text IS NULL OR c.checkpoint_id = %(checkpoint_id)s::text)
  AND (%(run_id)s::text IS NULL OR (c.metadata ->> 'run_id') = %(run_id)s::text)
  AND (%(filter)s::jsonb IS NULL OR c.metadata @> %(filter)s::jsonb)
  AND (%(before)s::text IS NULL OR c.checkpoint_id < %(before)s::text)
ORDER BY c.checkpoint_id DESC
LIMIT %(limit)s::bigint

-- name: pending_sends
-- Checkpoints of format v < 4 kept pending Send packets as writes of their parent. The
-- parents are (thread, namespace, checkpoint) triples: a global list() returns many
-- threads, and copy_thread gives two threads the same checkpoint ids.
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id,
       array_agg(w.type ORDER BY w.task_path, w.task_id, w.idx) AS types,
       array_agg(w.blob ORDER BY w.task_path, w.task_id, w.idx) AS blobs
FROM (SELECT DISTINCT * FROM unnest(%(thread_ids)s::text[], %(checkpoint_ns)s::text[],
                                    %(checkpoint_ids)s::text[]) AS p(thread_id, ns, id)) p
JOIN checkpoint_writes w
  ON w.thread_id = p.thread_id AND w.checkpoint_ns = p.ns AND w.checkpoint_id = p.id
 AND w.channel = '__pregel_tasks'
GROUP BY w.thread_id, w.checkpoint_ns, w.checkpoint_id

-- name: insert_blobs
-- A checkpoint's blobs in one statement (a statement costs ~30 us of server time and more
-- on the client, prepared or not). {rows} is blob_row once per blob, its parameters
-- suffixed _0, _1, ... (_statements._rows_sql); at most _statements.ROWS_MAX rows, so only a few
-- fixed shapes are ever prepared.
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT %(thread_id)s, %(checkpoint_ns)s, b.channel, b.version, b.type, b.blob
FROM (VALUES {rows}) AS b (channel, version, type, blob)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING

-- name: blob_row
(%(channel)s::text, %(version)s::text, %(type)s::text, %(blob)s::bytea)

-- name: put_with
-- A checkpoint write ({put}: upsert_checkpoint or guarded_put_checkpoint) with its blobs
-- ({ctes}: blobs_cte) in one statement instead of several.
WITH {ctes}
{put}

-- name: blobs_cte
-- The checkpoint's blobs. A CTE nobody reads runs to completion after the main statement;
-- a refusal of the guard aborts both.
blobs AS (
{insert_blobs}
)

-- name: upsert_checkpoint
INSERT INTO checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
VALUES (%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_checkpoint_id)s,
        %(checkpoint)s, %(metadata)s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata

-- name: upsert_write
-- Special writes (error, interrupt, resume...) have fixed negative idx and replace the
-- previous one of the same task; regular writes are first-writer-wins.
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
VALUES (%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(task_id)s, %(task_path)s,
        %(idx)s, %(channel)s, %(type)s, %(blob)s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob

-- name: insert_writes
-- Regular (first-writer-wins) pending writes of one checkpoint in one statement: {rows}
-- is write_row once per write (as insert_blobs).
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, w.task_id, w.task_path, w.idx,
       w.channel, w.type, w.blob
FROM (VALUES {rows}) AS w (task_id, task_path, idx, channel, type, blob)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING

-- name: write_row
(%(task_id)s::text, %(task_path)s::text, %(idx)s::integer, %(channel)s::text,
 %(type)s::text, %(blob)s::bytea)

-- name: delete_threads
-- The threads (delete_thread, prune with strategy "delete"), and the backups repair made
-- of them with their log rows (lgd_repairs): nothing of a deleted thread is left behind.
WITH ids AS (
    SELECT unnest(%(thread_ids)s::text[]) AS id
    UNION SELECT backup_thread_id FROM lgd_repairs WHERE thread_id = ANY(%(thread_ids)s)
),
     c AS (DELETE FROM checkpoints WHERE thread_id IN (SELECT id FROM ids)),
     w AS (DELETE FROM checkpoint_writes WHERE thread_id IN (SELECT id FROM ids)),
     ch AS (DELETE FROM lgd_chain WHERE thread_id IN (SELECT id FROM ids)),
     r AS (DELETE FROM lgd_runs WHERE thread_id IN (SELECT id FROM ids)),
     le AS (DELETE FROM lgd_leases WHERE thread_id IN (SELECT id FROM ids)),
     q AS (DELETE FROM lgd_queue WHERE thread_id IN (SELECT id FROM ids)),
     j AS (DELETE FROM lgd_journal WHERE thread_id IN (SELECT id FROM ids)),
     ja AS (DELETE FROM lgd_journal_attempts WHERE thread_id IN (SELECT id FROM ids)),
     rp AS (DELETE FROM lgd_repairs WHERE thread_id IN (SELECT id FROM ids))
DELETE FROM checkpoint_blobs WHERE thread_id IN (SELECT id FROM ids)

-- name: no_jit
-- For the rest of this transaction (the batch's pipeline): no JIT compilation. The
-- planner prices every jsonb_each_text() at 100 rows, so a delete of a few runs can look
-- costly enough to compile (~300 ms) for a few milliseconds of work.
SELECT set_config('jit', 'off', true)

-- name: delete_for_runs
-- The runs' checkpoints, their pending writes, and the blobs that only they referenced.
-- All CTEs read one snapshot, so the NOT EXISTS sees the rows before the delete.
-- Every step is a lookup by key (ledger rows through lgd_runs_run_id_idx, blobs by
-- primary key then by ctid): the work and the plan's cost follow the rows deleted, not
-- the table sizes, so no JIT is compiled for a few rows and nothing is scanned whole.
WITH doomed AS (
    DELETE FROM checkpoints
    WHERE (metadata ->> 'run_id') = ANY(%(run_ids)s)
    RETURNING thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
              checkpoint -> 'channel_versions' AS versions
), writes AS (
    DELETE FROM checkpoint_writes w USING doomed d
    WHERE w.thread_id = d.thread_id AND w.checkpoint_ns = d.checkpoint_ns
      AND w.checkpoint_id = d.checkpoint_id
), chain AS (
    -- A deleted checkpoint no longer holds its parent's child slot (looked up by key).
    DELETE FROM lgd_chain ch USING doomed d
    WHERE ch.thread_id = d.thread_id AND ch.checkpoint_ns = d.checkpoint_ns
      AND ch.parent_checkpoint_id = coalesce(d.parent_checkpoint_id, '')
      AND ch.checkpoint_id = d.checkpoint_id
), ledger AS (
    DELETE FROM lgd_runs WHERE run_id = ANY(%(run_ids)s)
), journal AS (
    DELETE FROM lgd_journal WHERE run_id = ANY(%(run_ids)s)
), journal_attempts AS (
    DELETE FROM lgd_journal_attempts WHERE run_id = ANY(%(run_ids)s)
), freed AS (
    SELECT DISTINCT d.thread_id, d.checkpoint_ns, v.key AS channel, v.value AS version
    FROM doomed d CROSS JOIN LATERAL jsonb_each_text(CASE WHEN jsonb_typeof(d.versions) = 'object' THEN d.versions END) AS v
), namespaces AS (
    SELECT DISTINCT thread_id, checkpoint_ns FROM freed
), referenced AS (
    -- What the checkpoints that stay still reference, in one pass over each namespace
    -- touched (OFFSET 0: each namespace read by its key, whatever the estimates).
    SELECT n.thread_id, n.checkpoint_ns, r.channel, r.version
    FROM namespaces n
    CROSS JOIN LATERAL (
        SELECT v.key AS channel, v.value AS version
        FROM checkpoints c
        CROSS JOIN LATERAL jsonb_each_text(
            CASE WHEN jsonb_typeof(c.checkpoint -> 'channel_versions') = 'object' THEN c.checkpoint -> 'channel_versions' END) AS v
        WHERE c.thread_id = n.thread_id AND c.checkpoint_ns = n.checkpoint_ns
          AND NOT coalesce((c.metadata ->> 'run_id') = ANY(%(run_ids)s), false)
        OFFSET 0
    ) r
), unreferenced AS (
    SELECT k.ctid FROM freed f
    CROSS JOIN LATERAL (
        SELECT b.ctid FROM checkpoint_blobs b
        WHERE b.thread_id = f.thread_id AND b.checkpoint_ns = f.checkpoint_ns
          AND b.channel = f.channel AND b.version = f.version
        OFFSET 0
    ) k
    WHERE NOT EXISTS (
        SELECT 1 FROM referenced r
        WHERE r.thread_id = f.thread_id AND r.checkpoint_ns = f.checkpoint_ns
          AND r.channel = f.channel AND r.version = f.version
    )
)
DELETE FROM checkpoint_blobs b WHERE b.ctid = ANY(ARRAY(SELECT ctid FROM unreferenced))

-- name: copy_thread
-- A whole thread (every namespace, blob and pending write) under a new thread_id. Rows
-- the target already has are kept as they are.
WITH c AS (
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
    FROM checkpoints WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING
), b AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %(target)s, checkpoint_ns, channel, version, type, blob
    FROM checkpoint_blobs WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING
), j AS (
    -- Durable ops the copy's tasks already did (fencing records stay with the source).
    INSERT INTO lgd_journal (thread_id, task_ns, op_key, checkpoint_ns, checkpoint_id, run_id,
                             attempt, status, executions, type, blob, claimed_at, completed_at)
    SELECT %(target)s, task_ns, op_key, checkpoint_ns, checkpoint_id, run_id, attempt, status,
           executions, type, blob, claimed_at, completed_at
    FROM lgd_journal WHERE thread_id = %(source)s AND status <> 'running'
    ON CONFLICT DO NOTHING
)
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
FROM checkpoint_writes WHERE thread_id = %(source)s
ON CONFLICT DO NOTHING

-- name: delta_threads
-- Threads whose state a DeltaChannel rebuilds from older checkpoints: keep_latest would
-- lose it. A delta snapshot is an inline `true` marker with a blob behind it.
SELECT DISTINCT c.thread_id FROM checkpoints c
WHERE c.thread_id = ANY(%(thread_ids)s) AND (
    c.metadata ? 'counters_since_delta_snapshot'
    OR c.metadata ? 'delta_writes_versioned'
    OR EXISTS (
        SELECT 1 FROM jsonb_each(c.checkpoint -> 'channel_values') AS v
        JOIN checkpoint_blobs b
          ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
         AND b.channel = v.key AND b.version = c.checkpoint -> 'channel_versions' ->> v.key
        WHERE v.value = 'true'::jsonb
    )
)

-- name: prune_keep_latest
-- Keeps each namespace's newest checkpoint (plus, for format v < 4, the parent holding its
-- pending sends), with its writes and the blobs it references; a kept checkpoint whose
-- parent goes becomes a root. A subgraph call's namespace ("node:task-id", unlike a
-- checkpointer=True subgraph's, whose state outlives each call) goes whole with the root
-- checkpoint it started from, once that one is saved and deleted (a run saves in the
-- background, so a call can commit before its root). Deletes writes only of the checkpoints
-- deleted: a run may commit a step's writes before their checkpoint. Runs under REPEATABLE
-- READ, one snapshot: a concurrent run's new rows are neither seen nor lost, and a thread
-- that has turned to a DeltaChannel since the caller's check is left as it is (returns
-- refused = true).
WITH refusal AS (
    SELECT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = %(thread_id)s AND (
            c.metadata ? 'counters_since_delta_snapshot'
            OR c.metadata ? 'delta_writes_versioned'
            OR EXISTS (
                SELECT 1 FROM jsonb_each(c.checkpoint -> 'channel_values') AS v
                JOIN checkpoint_blobs b
                  ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
                 AND b.channel = v.key
                 AND b.version = c.checkpoint -> 'channel_versions' ->> v.key
                WHERE v.value = 'true'::jsonb))
    ) AS refused
), heads AS (
    SELECT DISTINCT ON (checkpoint_ns) checkpoint_ns, checkpoint_id, parent_checkpoint_id,
           (checkpoint ->> 'v')::int AS format, metadata -> 'parents' ->> '' AS root
    FROM checkpoints WHERE thread_id = %(thread_id)s
    ORDER BY checkpoint_ns, checkpoint_id DESC
), latest AS (
    SELECT checkpoint_ns, checkpoint_id FROM heads
    UNION
    SELECT h.checkpoint_ns, h.parent_checkpoint_id FROM heads h
    WHERE h.format < 4 AND EXISTS (
        SELECT 1 FROM checkpoint_writes w
        WHERE w.thread_id = %(thread_id)s AND w.checkpoint_ns = h.checkpoint_ns
          AND w.checkpoint_id = h.parent_checkpoint_id AND w.channel = '__pregel_tasks')
), calls AS (
    SELECT h.checkpoint_ns FROM heads h
    WHERE strpos(h.checkpoint_ns, ':') > 0
      AND NOT EXISTS (SELECT 1 FROM latest l
                      WHERE l.checkpoint_ns = '' AND l.checkpoint_id = h.root)
      AND EXISTS (SELECT 1 FROM checkpoints r
                  WHERE r.thread_id = %(thread_id)s AND r.checkpoint_ns = ''
                    AND r.checkpoint_id = h.root)
), kept AS (
    SELECT l.checkpoint_ns, l.checkpoint_id FROM latest l
    WHERE NOT EXISTS (SELECT 1 FROM calls x WHERE x.checkpoint_ns = l.checkpoint_ns)
), doomed AS (
    DELETE FROM checkpoints c
    WHERE c.thread_id = %(thread_id)s AND NOT (SELECT refused FROM refusal)
      AND NOT EXISTS (SELECT 1 FROM kept k
                      WHERE k.checkpoint_ns = c.checkpoint_ns AND k.checkpoint_id = c.checkpoint_id)
    RETURNING c.checkpoint_ns, c.checkpoint_id, c.checkpoint -> 'channel_versions' AS versions
), writes AS (
    DELETE FROM checkpoint_writes w
    WHERE w.thread_id = %(thread_id)s AND NOT (SELECT refused FROM refusal)
      AND (EXISTS (SELECT 1 FROM doomed d WHERE d.checkpoint_ns = w.checkpoint_ns
                   AND d.checkpoint_id = w.checkpoint_id)
           OR w.checkpoint_ns IN (SELECT checkpoint_ns FROM calls))
), call_blobs AS (
    DELETE FROM checkpoint_blobs b
    WHERE b.thread_id = %(thread_id)s AND NOT (SELECT refused FROM refusal)
      AND b.checkpoint_ns IN (SELECT checkpoint_ns FROM calls)
), journal AS (
    -- Durable ops of tasks that ran from a deleted checkpoint: no retry can reach them.
    DELETE FROM lgd_journal j USING doomed d
    WHERE j.thread_id = %(thread_id)s AND j.checkpoint_ns = d.checkpoint_ns
      AND j.checkpoint_id = d.checkpoint_id
), orphaned AS (
    UPDATE checkpoints c SET parent_checkpoint_id = NULL
    FROM kept k
    WHERE c.thread_id = %(thread_id)s AND NOT (SELECT refused FROM refusal)
      AND c.checkpoint_ns = k.checkpoint_ns AND c.checkpoint_id = k.checkpoint_id
      AND c.parent_checkpoint_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM kept p WHERE p.checkpoint_ns = k.checkpoint_ns
                      AND p.checkpoint_id = c.parent_checkpoint_id)
), freed AS (
    SELECT DISTINCT d.checkpoint_ns, v.key AS channel, v.value AS version
    FROM doomed d CROSS JOIN LATERAL jsonb_each_text(CASE WHEN jsonb_typeof(d.versions) = 'object' THEN d.versions END) AS v
), referenced AS (
    SELECT DISTINCT c.checkpoint_ns, v.key AS channel, v.value AS version
    FROM checkpoints c
    JOIN kept k ON k.checkpoint_ns = c.checkpoint_ns AND k.checkpoint_id = c.checkpoint_id
    CROSS JOIN LATERAL jsonb_each_text(
            CASE WHEN jsonb_typeof(c.checkpoint -> 'channel_versions') = 'object' THEN c.checkpoint -> 'channel_versions' END) AS v
    WHERE c.thread_id = %(thread_id)s
), blobs AS (
    DELETE FROM checkpoint_blobs b USING freed f
    WHERE b.thread_id = %(thread_id)s AND b.checkpoint_ns = f.checkpoint_ns
      AND b.channel = f.channel AND b.version = f.version
      AND NOT EXISTS (SELECT 1 FROM referenced r WHERE r.checkpoint_ns = f.checkpoint_ns
                      AND r.channel = f.channel AND r.version = f.version)
)
SELECT refused FROM refusal

-- name: delta_history
-- Walks the parent chain of a checkpoint once for all requested channels, in one round
-- trip. A channel stops at the nearest ancestor that stores a value for it (inline in
-- channel_values, or a blob that is not the "empty" marker); the walk ends when every
-- channel has stopped or the root is reached. An inline JSON null is no value: put()
-- stores a None channel that way, and a seed of None would drop the writes beyond it. Returns that ancestor's value ('s' rows)
-- and every write to a still-walking channel on the way ('w' rows).
WITH RECURSIVE walk AS (
    SELECT c.checkpoint_id, c.parent_checkpoint_id, c.checkpoint,
           %(channels)s::text[] AS walking, 1 AS depth
    FROM checkpoints t
    JOIN checkpoints c
      ON c.thread_id = t.thread_id AND c.checkpoint_ns = t.checkpoint_ns
     AND c.checkpoint_id = t.parent_checkpoint_id
    WHERE t.thread_id = %(thread_id)s AND t.checkpoint_ns = %(checkpoint_ns)s
      AND t.checkpoint_id = %(checkpoint_id)s
  UNION ALL
    SELECT p.checkpoint_id, p.parent_checkpoint_id, p.checkpoint,
           ARRAY(SELECT ch FROM unnest(w.walking) AS ch
                 WHERE NOT (ch = ANY(s.stopped))), w.depth + 1
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT ARRAY(
            SELECT ch FROM unnest(w.walking) AS ch
            WHERE jsonb_typeof(w.checkpoint -> 'channel_values' -> ch) <> 'null'
               OR EXISTS (SELECT 1 FROM checkpoint_blobs b
                          WHERE b.thread_id = %(thread_id)s AND b.checkpoint_ns = %(checkpoint_ns)s
                            AND b.channel = ch AND b.type <> 'empty'
                            AND b.version = w.checkpoint -> 'channel_versions' ->> ch)
        ) AS stopped
    ) s
    JOIN checkpoints p
      ON p.thread_id = %(thread_id)s AND p.checkpoint_ns = %(checkpoint_ns)s
     AND p.checkpoint_id = w.parent_checkpoint_id
    WHERE cardinality(w.walking) > cardinality(s.stopped)
)
SELECT 'w' AS kind, cw.checkpoint_id, w.depth, cw.channel, cw.type, cw.blob,
       cw.task_id, cw.task_path, cw.idx, NULL::jsonb AS inline
FROM walk w
JOIN checkpoint_writes cw
  ON cw.thread_id = %(thread_id)s AND cw.checkpoint_ns = %(checkpoint_ns)s
 AND cw.checkpoint_id = w.checkpoint_id AND cw.channel = ANY(w.walking)
UNION ALL
SELECT 's', w.checkpoint_id, w.depth, ch, b.type, b.blob, NULL, NULL, NULL,
       w.checkpoint -> 'channel_values' -> ch
FROM walk w
CROSS JOIN LATERAL unnest(w.walking) AS ch
LEFT JOIN checkpoint_blobs b
  ON b.thread_id = %(thread_id)s AND b.checkpoint_ns = %(checkpoint_ns)s
 AND b.channel = ch AND b.type <> 'empty'
 AND b.version = w.checkpoint -> 'channel_versions' ->> ch
WHERE jsonb_typeof(w.checkpoint -> 'channel_values' -> ch) <> 'null' OR b.channel IS NOT NULL

-- name: swept
-- The last four columns of select_head_with_run and select_addressed_with_run ({swept},
-- filled by _statements._start_read_sql): the calling run's tombstone and its thread's,
-- when a retention sweep removed them (migration 0026). Indented as where it stands, so
-- the statements sent are the text they were before it was one block.
(SELECT s.swept_at FROM lgd_swept_runs s
        WHERE s.thread_id = %(thread_id)s AND s.run_id = %(run_id)s) AS run_swept_at,
       (SELECT s.strategy FROM lgd_swept_runs s
        WHERE s.thread_id = %(thread_id)s AND s.run_id = %(run_id)s) AS run_swept_strategy,
       (SELECT t.swept_at FROM lgd_swept_threads t
        WHERE t.thread_id = %(thread_id)s) AS thread_swept_at,
       (SELECT t.kept_checkpoint_id FROM lgd_swept_threads t
        WHERE t.thread_id = %(thread_id)s) AS thread_kept

-- name: select_head_with_run
-- The latest root checkpoint of a thread (as select_checkpoint) plus, when it was not
-- written by the calling run, that run's ledger row: the start checks of a graph run in
-- one round trip. Always returns one row (NULLs when the thread is new). The last four
-- columns ({swept}): the run's tombstone and the thread's, when a retention sweep removed
-- them.
WITH head AS (
    {select_checkpoint}
    WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
    ORDER BY c.checkpoint_id DESC LIMIT 1
)
SELECT head.*, r.status, r.last_checkpoint_id, r.input_fingerprint,
       {swept}
FROM (SELECT 1) AS one
LEFT JOIN head ON true
LEFT JOIN lgd_runs r
  ON r.thread_id = %(thread_id)s AND r.run_id = %(run_id)s
 AND (head.metadata ->> 'run_id') IS DISTINCT FROM %(run_id)s

-- name: select_addressed_with_run
-- A graph run addressed at a checkpoint (time travel): that checkpoint, the calling run's
-- ledger row as in select_head_with_run, and the thread's latest checkpoint id (a past
-- checkpoint is a deliberate branch point).
WITH head AS (
    {select_checkpoint}
    WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
      AND c.checkpoint_id = %(checkpoint_id)s
)
SELECT head.*, r.status, r.last_checkpoint_id, r.input_fingerprint,
       (SELECT max(l.checkpoint_id) FROM checkpoints l
        WHERE l.thread_id = %(thread_id)s AND l.checkpoint_ns = '') AS latest,
       {swept}
FROM (SELECT 1) AS one
LEFT JOIN head ON true
LEFT JOIN lgd_runs r
  ON r.thread_id = %(thread_id)s AND r.run_id = %(run_id)s
 AND (head.metadata ->> 'run_id') IS DISTINCT FROM %(run_id)s

-- name: admit
-- The admission of a graph run (migrations 0014, 0024): sent in the pipeline of its head
-- read.
SELECT * FROM lgd_admit_v4(%(thread_id)s, %(run_id)s, %(attempt)s, %(strategy)s, %(ttl)s,
                           %(ticket)s::bigint)

-- name: journal_admit
-- The admission of a graph run PostgresJournal drives (migrations 0021, 0024):
-- lgd_admit_v4, and the attempt registered in the journal; fence_at: the fence check its
-- first op may use.
SELECT * FROM lgd_journal_admit_v2(%(thread_id)s, %(run_id)s, %(attempt)s, %(strategy)s,
                                   %(ttl)s, %(ticket)s::bigint)

-- name: journal_holds_run
-- Whether an attempt still holds its run in the journal (no other attempt fenced it off):
-- a PostgresJournal call that lost a checkpoint race to its own run resumes only then.
SELECT NOT EXISTS (
    SELECT 1 FROM lgd_journal_attempts a
    WHERE a.thread_id = %(thread_id)s AND a.attempt = %(attempt)s AND a.fenced_by IS NOT NULL
)

-- name: journal_unadmit
-- With unadmit, for a refused journaled admission: its registration undone.
SELECT lgd_journal_unadmit_v1(%(thread_id)s, %(attempt)s)

-- name: unadmit
-- A refused start undoes its admission (migration 0024: and wakes the queue, as a release).
SELECT lgd_unadmit_v4(%(thread_id)s, %(attempt)s, %(run_id)s::text, %(holder_attempt)s::text,
                      %(expires_at)s::timestamptz, %(ended)s::text, %(strategy)s::text,
                      %(outcome)s::text, %(acquired_at)s::timestamptz)

-- name: release_lease
SELECT lgd_release_v4(%(thread_id)s, %(run_id)s, %(attempt)s, %(ended)s)

-- name: release_lease_lazy
-- The release alone in its transaction (no pending writes ride with it: the usual case),
-- committed without waiting for the WAL flush: the caller gets the commit one flush sooner
-- and every session sees the lease ended at once. Only its durability waits (for the WAL
-- writer, or the next commit that flushes, at most ~3 x wal_writer_delay): lost to a server
-- crash, the lease is as a crashed worker's, it expires. Everything the run wrote before
-- was committed durably by then.
SELECT lgd_release_v4(%(thread_id)s, %(run_id)s, %(attempt)s, %(ended)s),
       set_config('synchronous_commit', 'off', true)

-- name: abandon_lease
-- The release of an attempt whose call raised before it stored anything (migration 0024):
-- its admission undone, the queue woken. Committed as release_lease_lazy is.
SELECT lgd_unadmit_v4(%(thread_id)s, %(attempt)s, %(run_id)s::text, %(holder_attempt)s::text,
                      %(expires_at)s::timestamptz, %(ended)s::text, %(strategy)s::text,
                      %(outcome)s::text, %(acquired_at)s::timestamptz),
       set_config('synchronous_commit', 'off', true)

-- name: mark_interrupted
-- At the release of a graph call that stored an interrupt, before it (the lease still
-- this attempt's): its run's ledger row, if it reads running, is interrupted at that
-- checkpoint. Under durability "async" the interrupt's write (lgd_guard_writes_v6 marks the
-- row) can commit before the put that creates the row, which then reads running.
UPDATE lgd_runs r SET status = 'interrupted', last_checkpoint_id = %(checkpoint_id)s,
                      updated_at = now()
FROM lgd_leases l
WHERE r.thread_id = %(thread_id)s AND r.run_id = %(run_id)s AND r.status = 'running'
  AND l.thread_id = r.thread_id AND l.attempt = %(attempt)s AND l.ended IS NULL

-- name: renew_leases
-- The heartbeat of the graph runs in flight in one process (one statement for all): the
-- lease of each (thread, run), whichever attempt of the run it names (a retry that took
-- it over and then lost the race to this attempt left it so).
UPDATE lgd_leases l SET expires_at = now() + l.ttl
FROM unnest(%(threads)s::text[], %(runs)s::text[]) AS h (thread_id, run_id)
WHERE l.thread_id = h.thread_id AND l.run_id = h.run_id AND l.ended IS NULL

-- name: run_journaled
-- Whether a run had attempts under a DeterministicRunner's journal (read when refusing a
-- new run because this one is unfinished: the fix the error names depends on it).
SELECT 1 FROM lgd_journal_attempts WHERE thread_id = %(thread_id)s AND run_id = %(run_id)s
LIMIT 1

-- name: leave_queue
DELETE FROM lgd_queue WHERE thread_id = %(thread_id)s AND ticket = %(ticket)s

-- name: select_run
-- A run's ledger row, the thread's lease while the run holds it, and its last root
-- checkpoint, in one round trip.
SELECT r.thread_id, r.run_id, r.status, r.attempts, r.first_checkpoint_id,
       coalesce(cp.checkpoint_id, r.last_checkpoint_id), r.input_fingerprint, r.superseded_by, r.created_at,
       r.updated_at, r.multitask_strategy, r.multitask_outcome,
       l.run_id, l.attempt, l.strategy, l.outcome, l.acquired_at, l.expires_at, l.ended,
       cp.*
FROM lgd_runs r
LEFT JOIN lgd_leases l ON l.thread_id = r.thread_id AND l.run_id = r.run_id
LEFT JOIN LATERAL (
    {select_checkpoint}
    WHERE c.thread_id = r.thread_id AND c.checkpoint_ns = ''
      AND c.checkpoint_id = CASE
          WHEN r.status IN ('done', 'superseded') THEN r.last_checkpoint_id
          ELSE (SELECT max(l.checkpoint_id) FROM checkpoints l
                WHERE (l.metadata ->> 'run_id') = r.run_id AND l.thread_id = r.thread_id
                  AND l.checkpoint_ns = '')
      END
) cp ON true
WHERE r.thread_id = %(thread_id)s AND r.run_id = %(run_id)s

-- name: guarded_put_checkpoint
-- upsert_checkpoint with the arbitration of migration 0016 (the lease, one child per
-- attempt lineage, the ledger) in one statement; closes/closes_run: contract.guard_put.
-- Then, for a write with a run id, the parent must exist (migration 0025, LG414: lost in
-- a failover); a direct put without one may name any parent, as with PostgresSaver.
SELECT lgd_put_checkpoint_v6(
    %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_checkpoint_id)s::text,
    %(checkpoint)s, %(metadata)s, %(run_id)s::text, %(attempt)s::text,
    %(fingerprint)s::text, %(ledger)s, %(branch)s, %(closes)s::text, %(closes_run)s::text),
    lgd_require_parent_v1(%(thread_id)s, %(checkpoint_ns)s,
        CASE WHEN %(run_id)s::text IS NOT NULL THEN %(parent_checkpoint_id)s::text END)

-- name: select_parent_progress
-- The parent of a root write outside a graph run (contract.needs_parent): its run and its
-- checkpoint, from which the contract decides what the write makes of that run.
SELECT metadata ->> 'run_id', checkpoint FROM checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(checkpoint_id)s

-- name: guard_writes
SELECT lgd_guard_writes_v6(
    %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(run_id)s::text,
    %(command)s, %(interrupted)s)

-- name: refuse_attempt
-- After a duplicate Command was refused (LG412): bar the attempt that sent it from
-- continuing the checkpoint, since LangGraph already applied the Command in memory.
INSERT INTO lgd_chain (thread_id, checkpoint_ns, parent_checkpoint_id, checkpoint_id, run_id, attempt)
VALUES (%(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, 'refused:' || %(attempt)s, %(run_id)s, %(attempt)s)
ON CONFLICT (thread_id, checkpoint_ns, parent_checkpoint_id) DO NOTHING

-- name: guarded_write
-- One pending write, fenced (migration 0023): refused by lgd_fence_writes_v7, called only
-- when the checkpoint's slot in the writer's lineage is held already, if another attempt
-- has continued the checkpoint; and by lgd_refuse_leased_v7 ({lease_probe}: the block
-- lease_probe), called only then, while another run holds a live lease on the thread.
-- Both are index probes inside this one statement.
-- replace: upsert_write's conflict rule (special writes replace the task's previous one),
-- else insert_writes' (first writer wins: the update's WHERE is false). Special writes
-- only: regular ones go as guarded_writes.
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(task_id)s, %(task_path)s,
       %(idx)s, %(channel)s, %(type)s, %(blob)s
WHERE NOT EXISTS (
    SELECT 1 FROM lgd_chain ch
    WHERE ch.thread_id = %(thread_id)s AND ch.checkpoint_ns = %(checkpoint_ns)s
      AND ch.parent_checkpoint_id = %(slot)s
      AND lgd_fence_writes_v7(ch.checkpoint_id, ch.run_id, ch.attempt, %(attempt)s::text,
                              %(checkpoint_id)s, %(checkpoint_ns)s)
){lease_probe}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
WHERE %(replace)s

-- name: guarded_writes
-- Regular pending writes of one checkpoint, fenced as guarded_write, in one statement
-- ({rows}: write_row once per write, as insert_blobs). The fence and the lease check do
-- not depend on the row: the planner runs each once per statement (a one-time filter).
-- First writer wins (DO NOTHING: a DO UPDATE could not touch a row twice in one statement).
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, w.task_id, w.task_path, w.idx,
       w.channel, w.type, w.blob
FROM (VALUES {rows}) AS w (task_id, task_path, idx, channel, type, blob)
WHERE NOT EXISTS (
    SELECT 1 FROM lgd_chain ch
    WHERE ch.thread_id = %(thread_id)s AND ch.checkpoint_ns = %(checkpoint_ns)s
      AND ch.parent_checkpoint_id = %(slot)s
      AND lgd_fence_writes_v7(ch.checkpoint_id, ch.run_id, ch.attempt, %(attempt)s::text,
                              %(checkpoint_id)s, %(checkpoint_ns)s)
){lease_probe}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING

-- name: lease_probe
-- The lease check of guarded_write(s) ({lease_probe}, filled by _statements._block). Left out
-- (riding_write, riding_writes) when the writes ride in the transaction of their
-- checkpoint's child (put's pending), before it: the child's lgd_put_checkpoint_v6 checks
-- the same lease later in that transaction, refusing (LG413) and rolling back the same
-- writes. The chain fence stays, so that its LG410/LG412 come first.
AND NOT EXISTS (
    SELECT 1 FROM lgd_leases l
    WHERE l.thread_id = %(thread_id)s AND l.ended IS NULL AND l.expires_at > now()
      AND l.run_id IS DISTINCT FROM %(run_id)s::text
      AND lgd_refuse_leased_v7(l.run_id, l.thread_id, l.outcome)
)

-- name: child_of_run
-- put_batch's at-most-once check: the root checkpoint a run wrote on top of the one it
-- started from (NULL: the thread's first), if its commit already got through.
SELECT checkpoint_id FROM checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = ''
  AND parent_checkpoint_id IS NOT DISTINCT FROM %(parent)s::text
  AND (metadata ->> 'run_id') IS NOT DISTINCT FROM %(run_id)s::text
LIMIT 1

-- name: journal_claim_v2
-- Claim a durable op and read every other op its task has in the journal (migration 0013).
SELECT op_key, status, type, blob, claimed_at, fence_at FROM lgd_journal_claim_v2(
    %(thread_id)s, %(task_ns)s, %(op_key)s, %(checkpoint_ns)s, %(checkpoint_id)s,
    %(run_id)s::text, %(attempt)s)

-- name: journal_store_v4
-- Store a durable op's outcome (migration 0025); fence_at: the fence check a next op may
-- start on; lost: the attempt's registration is gone from the database (a failover).
SELECT stored, fence_at, lost FROM lgd_journal_store_v4(
    %(thread_id)s, %(task_ns)s, %(op_key)s, %(checkpoint_ns)s, %(checkpoint_id)s,
    %(run_id)s::text, %(attempt)s, %(claimed)s, %(fence_at)s::timestamptz, %(status)s,
    %(type)s, %(blob)s)

-- name: lease_holder
-- Who holds a thread's lease, read only after an LG413 (_core._lost_admission).
SELECT run_id, attempt, acquired_at FROM lgd_leases WHERE thread_id = %(thread_id)s
