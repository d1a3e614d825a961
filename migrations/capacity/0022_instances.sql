-- Instances: the inline table of `instance.*` events. `doc` is the instance as its events fold (the API answers
-- it); the columns beside it are what queries select on: a tenant's list, the reservation that holds the
-- allocation (one instance per reservation), and the states a node's agent is sent.
CREATE TABLE instances (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    reservation_id text NOT NULL UNIQUE,
    pool_id text NOT NULL,
    desired text NOT NULL,
    state text NOT NULL,
    doc jsonb NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX instances_tenant ON instances (tenant_id, id);
CREATE INDEX instances_live ON instances (reservation_id) WHERE state NOT IN ('deleted', 'failed');
