-- Named queries of `langgraph-deterministic repair` (see ops/repair.py). Each thread is
-- repaired in one transaction, under a short lock_timeout, after its head is locked.

-- name: lock_head
-- The thread's head, locked: a worker of ours writing the thread meanwhile waits (then
-- finds its slot taken), and the repair sees whether the head moved since the audit.
SELECT checkpoint_id, checkpoint, metadata FROM checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = ''
ORDER BY checkpoint_id DESC LIMIT 1
FOR UPDATE

-- name: head_blob
SELECT type, blob FROM checkpoint_blobs
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND channel = %(channel)s
  AND version = %(version)s

-- name: checkpoint_versions
SELECT checkpoint -> 'channel_versions' FROM checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(checkpoint_id)s

-- name: input_writes
SELECT channel, type, blob FROM checkpoint_writes
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(checkpoint_id)s
  AND channel NOT LIKE 'branch:to:%%' AND channel NOT LIKE '\_\_%%'
ORDER BY idx

-- name: dead_branches
-- Root-namespace checkpoints that are neither the head nor its ancestors and descend from
-- a child of a fork point written by a graph run: the branch that lost.
WITH RECURSIVE ancestry AS (
    SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints
    WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(head)s
    UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id FROM checkpoints c
    JOIN ancestry a ON c.checkpoint_id = a.parent_checkpoint_id
    WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
), dead AS (
    SELECT c.checkpoint_id FROM checkpoints c
    WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
      AND c.parent_checkpoint_id = ANY(%(fork_parents)s)
      AND c.metadata ->> 'source' IN ('loop', 'input')
      AND c.checkpoint_id NOT IN (SELECT checkpoint_id FROM ancestry)
    UNION
    SELECT c.checkpoint_id FROM checkpoints c JOIN dead d ON c.parent_checkpoint_id = d.checkpoint_id
    WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
)
SELECT array_agg(checkpoint_id ORDER BY checkpoint_id) FROM dead

-- name: delete_checkpoints
WITH w AS (
    DELETE FROM checkpoint_writes
    WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = ANY(%(ids)s)
)
DELETE FROM checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = ANY(%(ids)s)

-- name: delete_chain
DELETE FROM lgd_chain
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = ANY(%(ids)s)

-- name: insert_blob
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
VALUES (%(thread_id)s, '', %(channel)s, %(version)s, %(type)s, %(blob)s)

-- name: insert_checkpoint
INSERT INTO checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
VALUES (%(thread_id)s, '', %(checkpoint_id)s, %(parent)s, %(checkpoint)s, %(metadata)s)

-- name: claim_slot
-- Our saver's fencing: the repair checkpoint takes the head's one child slot, so an
-- attempt of ours still running on the old head can write nothing more (LG409/LG410).
INSERT INTO lgd_chain (thread_id, checkpoint_ns, parent_checkpoint_id, checkpoint_id, run_id, attempt)
VALUES (%(thread_id)s, '', %(parent)s, %(checkpoint_id)s, %(run_id)s, 'lgd-repair')
ON CONFLICT (thread_id, checkpoint_ns, parent_checkpoint_id) DO NOTHING
RETURNING 1

-- name: close_runs
-- The runs left running on the repaired thread are closed by the repair, as a later run
-- would close them.
UPDATE lgd_runs SET status = 'superseded', superseded_by = %(run_id)s, updated_at = now()
WHERE thread_id = %(thread_id)s AND status IN ('running', 'interrupted')
  AND run_id <> %(run_id)s

-- name: record
INSERT INTO lgd_repairs
    (repair_id, thread_id, faults, actions, old_head, new_head, backup_thread_id)
VALUES (%(repair_id)s, %(thread_id)s, %(faults)s, %(actions)s, %(old_head)s, %(new_head)s,
        %(backup)s)

-- name: has_tables
SELECT to_regclass('lgd_repairs') IS NOT NULL, to_regclass('lgd_chain') IS NOT NULL,
       to_regclass('lgd_runs') IS NOT NULL

-- name: pre_changes
-- What `migrate --phase pre` would change on the peer's tables (its message says so):
-- task_path there?, the run id index there?, lz4 available and not yet set?, the peer's
-- versions 0-9 it would record.
SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('checkpoint_writes')
               AND attname = 'task_path' AND NOT attisdropped),
       to_regclass('checkpoints_run_id_idx') IS NOT NULL,
       current_setting('server_version_num')::int >= 140000
       AND EXISTS (SELECT 1 FROM pg_settings
                   WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))
       AND EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid IN (to_regclass('checkpoints'), to_regclass('checkpoint_blobs'),
                                      to_regclass('checkpoint_writes'))
                     AND attname IN ('checkpoint', 'blob') AND attcompression::text <> 'l'),
       (SELECT string_agg(v::text, ', ' ORDER BY v) FROM generate_series(0, 9) v
        WHERE NOT EXISTS (SELECT 1 FROM checkpoint_migrations m WHERE m.v = v.v))
