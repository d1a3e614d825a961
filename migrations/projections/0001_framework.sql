-- The asynchronous projections' bookkeeping. Each version of a projection has its own tables (<name>_v<N>), its
-- own checkpoint (the position of the last event it has passed) and its own lease; projection_active names the
-- version that reads use.

CREATE TABLE projection_checkpoints (
    name text NOT NULL,
    version integer NOT NULL CHECK (version >= 1),
    log_epoch integer NOT NULL DEFAULT 0,
    txid xid8 NOT NULL DEFAULT '0',
    seq bigint NOT NULL DEFAULT 0,
    -- Events of the projection's types applied, and events passed in all.
    events_applied bigint NOT NULL DEFAULT 0,
    events_passed bigint NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'building' CHECK (state IN ('building', 'live', 'retired')),
    -- When the last event passed was recorded, for lag in seconds.
    last_event_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (name, version)
);

CREATE TABLE projection_active (
    name text PRIMARY KEY,
    version integer NOT NULL CHECK (version >= 1),
    switched_at timestamptz NOT NULL DEFAULT compute_now()
);
