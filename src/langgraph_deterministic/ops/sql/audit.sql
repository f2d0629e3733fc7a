-- Named queries of `langgraph-deterministic audit` (see ops/audit.py). Read-only. Each
-- runs as its own autocommit statement under a short statement_timeout, over one range of
-- thread ids, so no statement holds a snapshot for long or locks anything.

-- name: next_bound
-- The thread id `rows` checkpoints after `lo`: the upper end of the next batch. An
-- index-only scan of the primary key.
SELECT thread_id FROM checkpoints
WHERE thread_id > %(lo)s
ORDER BY thread_id
OFFSET %(rows)s LIMIT 1

-- name: scan_batch
-- One row per thread of the range (root namespace): its head, whether the head has a step
-- left to run, forks and inputs applied on an unfinished step since the last repair, and
-- the head's messages blob when it holds any tool call (the only blob Python decodes).
-- A step is left to run when a `branch:to:<node>` trigger holds a value its node has not
-- seen, when the head is an input checkpoint (`__start__` not yet run), or when Send
-- packets are pending. A head whose JSON is not what LangGraph writes (not an object) is
-- reported `unreadable`; every JSON function is guarded so one such row never stops the scan.
WITH c AS MATERIALIZED (
    SELECT thread_id, checkpoint_id, parent_checkpoint_id,
           metadata ->> 'source' AS source, metadata ->> 'run_id' AS run_id,
           metadata ? 'lgd_repair' AS repaired
    FROM checkpoints
    WHERE checkpoint_ns = '' AND thread_id > %(lo)s
      AND (%(hi)s::text IS NULL OR thread_id <= %(hi)s)
      AND (%(only)s::text IS NULL OR thread_id = %(only)s)
      AND thread_id NOT LIKE 'lgd-backup:%%'  -- copies kept by repair
), k AS (
    SELECT thread_id, count(*) AS n, max(checkpoint_id) AS head_id,
           max(checkpoint_id) FILTER (WHERE repaired) AS repair_id
    FROM c GROUP BY thread_id
), forks AS (
    SELECT f.thread_id, array_agg(f.parent_checkpoint_id) AS parents FROM (
        SELECT c.thread_id, c.parent_checkpoint_id
        FROM c JOIN k USING (thread_id)
        WHERE c.parent_checkpoint_id IS NOT NULL AND c.source IN ('loop', 'input')
          AND (k.repair_id IS NULL OR c.checkpoint_id > k.repair_id)
        GROUP BY 1, 2 HAVING count(*) > 1
    ) f GROUP BY 1
), reinputs AS (
    SELECT i.thread_id,
           array_agg(ARRAY[i.checkpoint_id, (
               SELECT max(p.checkpoint_id) FROM c p
               WHERE p.thread_id = i.thread_id AND p.source = 'input'
                 AND p.checkpoint_id < i.checkpoint_id
                 AND p.run_id IS NOT DISTINCT FROM i.run_id)]) AS pairs
    FROM c i
    JOIN k USING (thread_id)
    JOIN checkpoints par ON par.thread_id = i.thread_id AND par.checkpoint_ns = ''
     AND par.checkpoint_id = i.parent_checkpoint_id
    WHERE i.source = 'input' AND (k.repair_id IS NULL OR i.checkpoint_id > k.repair_id)
      AND EXISTS (
          SELECT 1 FROM jsonb_each_text(CASE WHEN jsonb_typeof(par.checkpoint -> 'channel_versions') = 'object'
                                          THEN par.checkpoint -> 'channel_versions' END) v
          WHERE v.key LIKE 'branch:to:%%'
            AND (par.checkpoint -> 'channel_values') ? v.key
            AND v.value > coalesce(par.checkpoint -> 'versions_seen' -> substr(v.key, 11) ->> v.key, ''))
    GROUP BY 1
)
SELECT k.thread_id, k.n, k.head_id, h.checkpoint ->> 'ts' AS ts,
       h.metadata ->> 'run_id' AS run_id, h.metadata ->> 'source' AS source,
       (h.metadata ->> 'source' = 'input'
        OR EXISTS (
            SELECT 1 FROM jsonb_each_text(CASE WHEN jsonb_typeof(h.checkpoint -> 'channel_versions') = 'object'
                                          THEN h.checkpoint -> 'channel_versions' END) v
            WHERE v.key LIKE 'branch:to:%%'
              AND (h.checkpoint -> 'channel_values') ? v.key
              AND v.value > coalesce(h.checkpoint -> 'versions_seen' -> substr(v.key, 11) ->> v.key, ''))
        OR EXISTS (
            SELECT 1 FROM checkpoint_blobs t
            WHERE t.thread_id = k.thread_id AND t.checkpoint_ns = '' AND t.channel = '__pregel_tasks'
              AND t.version = h.checkpoint -> 'channel_versions' ->> '__pregel_tasks'
              AND t.type <> 'empty')
       ) AS pending,
       (EXISTS (
            SELECT 1 FROM checkpoint_writes w
            WHERE w.thread_id = k.thread_id AND w.checkpoint_ns = '' AND w.checkpoint_id = k.head_id
              AND w.channel = '__interrupt__')
        OR (h.checkpoint -> 'versions_seen' -> '__interrupt__') = (h.checkpoint -> 'channel_versions')
       ) AS interrupted,
       f.parents AS fork_parents,
       r.pairs AS reinput_pairs,
       CASE WHEN position(%(tool_call)s IN b.blob) > 0 THEN b.type END AS messages_type,
       CASE WHEN position(%(tool_call)s IN b.blob) > 0 THEN b.blob END AS messages_blob,
       CASE WHEN jsonb_typeof(h.checkpoint) <> 'object'
            THEN 'its checkpoint JSON is a ' || jsonb_typeof(h.checkpoint) || ', not an object'
            WHEN jsonb_typeof(h.checkpoint -> 'channel_versions') IS DISTINCT FROM 'object'
            THEN 'its channel_versions are not an object'
            WHEN jsonb_typeof(h.metadata) IS DISTINCT FROM 'object'
            THEN 'its metadata JSON is not an object'
            WHEN b.type NOT IN ('msgpack', 'json', 'null', 'bytes', 'bytearray', 'empty')
            THEN 'its ' || %(messages)s || ' blob is of an unknown kind, ' || quote_literal(b.type)
       END AS unreadable
FROM k
JOIN checkpoints h ON h.thread_id = k.thread_id AND h.checkpoint_ns = '' AND h.checkpoint_id = k.head_id
LEFT JOIN checkpoint_blobs b ON b.thread_id = k.thread_id AND b.checkpoint_ns = ''
 AND b.channel = %(messages)s AND b.version = h.checkpoint -> 'channel_versions' ->> %(messages)s
LEFT JOIN forks f ON f.thread_id = k.thread_id
LEFT JOIN reinputs r ON r.thread_id = k.thread_id
WHERE %(since)s::timestamptz IS NULL
   OR CASE WHEN (h.checkpoint ->> 'ts') ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d'
           THEN (h.checkpoint ->> 'ts')::timestamptz >= %(since)s::timestamptz
           ELSE true END  -- a head without a readable ts stays in the scan
ORDER BY k.thread_id

-- name: input_writes
-- What two input checkpoints applied (the `__start__` task's writes), to compare them.
SELECT checkpoint_id, array_agg(channel ORDER BY idx), array_agg(type ORDER BY idx),
       array_agg(blob ORDER BY idx)
FROM checkpoint_writes
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = ANY(%(ids)s)
  AND channel NOT LIKE 'branch:to:%%' AND channel NOT LIKE '\_\_%%'
GROUP BY checkpoint_id

-- name: ledger_running
-- Runs the ledger still shows as running, per thread of the range (tables of ours only).
SELECT thread_id, array_agg(run_id ORDER BY run_id)
FROM lgd_runs
WHERE status = 'running' AND thread_id > %(lo)s AND (%(hi)s::text IS NULL OR thread_id <= %(hi)s)
  AND (%(only)s::text IS NULL OR thread_id = %(only)s)
GROUP BY thread_id

-- name: has_ledger
SELECT to_regclass('lgd_runs') IS NOT NULL

-- name: wal_position
-- How far the server's WAL has got, in bytes: the audit writes none, so WAL that grows
-- between two ranges was written by live workers (on a standby: replayed from them).
SELECT pg_wal_lsn_diff(
    CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
    '0/0'
)::bigint
