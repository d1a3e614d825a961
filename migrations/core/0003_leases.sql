-- Ownership leases (shard:<n>, pool:<id>, site:<id>:boot, singleton:<job>, gateway:<id>). The epoch rises each
-- time the owner changes, and every fenced transaction re-reads the row FOR SHARE, so a process that lost its
-- lease can no longer commit work under it.
CREATE TABLE leases (
    name text PRIMARY KEY CHECK (name <> ''),
    owner text NOT NULL CHECK (owner <> ''),
    epoch bigint NOT NULL CHECK (epoch >= 1),
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT compute_now()
);
