-- The work queue: one row per key that needs attention at or after not_before. Enqueueing coalesces (gen rises,
-- the earlier not_before wins); a worker claims due rows with SKIP LOCKED until claimed_until; success deletes
-- the row only if gen is unchanged, so a key dirtied again while it was processed is not lost.
CREATE TABLE work_queue (
    key text PRIMARY KEY CHECK (key <> ''),
    shard integer NOT NULL CHECK (shard >= 0),
    gen bigint NOT NULL DEFAULT 1,
    not_before timestamptz NOT NULL DEFAULT compute_now(),
    claimed_until timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    enqueued_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE INDEX work_queue_due ON work_queue (shard, not_before);
