-- Version 1 of the read models: pools, nodes, reservations, the capacity rollup and the audit trail.

CREATE TABLE pools_v1 (
    pool_id text PRIMARY KEY,
    site_id text NOT NULL,
    owner_tenant_id text NOT NULL,
    name text NOT NULL,
    class text NOT NULL,
    gpu_model text NOT NULL,
    sharing text NOT NULL,
    agent text NOT NULL,
    policy jsonb NOT NULL,
    -- [{tenantId, quota, priority, includeDescendants}], ordered by tenant.
    offers jsonb NOT NULL DEFAULT '[]',
    node_count integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL
);
CREATE INDEX pools_v1_owner ON pools_v1 (owner_tenant_id, pool_id);
CREATE INDEX pools_v1_offers ON pools_v1 USING gin (offers jsonb_path_ops);

CREATE TABLE nodes_v1 (
    node_id text PRIMARY KEY,
    pool_id text NOT NULL,
    site_id text NOT NULL,
    owner_tenant_id text,
    pool_owner_tenant_id text NOT NULL,
    name text NOT NULL,
    role text NOT NULL,
    trust text NOT NULL,
    adapter text NOT NULL,
    provision_state text NOT NULL,
    maintenance boolean NOT NULL,
    cordoned boolean NOT NULL,
    connectivity text NOT NULL,
    conditions jsonb NOT NULL,
    no_schedule_reasons text[] NOT NULL,
    observed_generation bigint NOT NULL,
    schedulable boolean NOT NULL,
    gpu_count integer NOT NULL,
    atom_class text,
    atom_count integer NOT NULL,
    registered_at timestamptz NOT NULL
);
CREATE INDEX nodes_v1_pool ON nodes_v1 (pool_id, node_id);

CREATE TABLE reservations_v1 (
    reservation_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    identity text NOT NULL,
    pool_id text NOT NULL,
    project_id text,
    state text NOT NULL,
    resource text NOT NULL,
    count integer NOT NULL,
    request jsonb NOT NULL,
    priority integer NOT NULL,
    requested_at timestamptz NOT NULL,
    pending_deadline timestamptz NOT NULL,
    start_at timestamptz,
    end_at timestamptz,
    lease_deadline timestamptz,
    ended_at timestamptz,
    outcome text,
    allocations jsonb NOT NULL DEFAULT '[]',
    version integer NOT NULL
);
CREATE INDEX reservations_v1_tenant ON reservations_v1 (tenant_id, reservation_id);
CREATE INDEX reservations_v1_pool ON reservations_v1 (pool_id, state);

-- Per pool and resource: allocatable (atoms on schedulable nodes), allocated (atoms of reservations binding,
-- active or releasing), reserved (atoms of placed reservations, not yet started), available (allocatable -
-- allocated). Defined by state, so it changes only through events.
CREATE TABLE pool_capacity_rollup_v1 (
    pool_id text NOT NULL,
    resource text NOT NULL,
    allocatable integer NOT NULL,
    allocated integer NOT NULL,
    reserved integer NOT NULL,
    available integer NOT NULL,
    PRIMARY KEY (pool_id, resource)
);
-- The rollup's own state: atoms per node, and atoms held per reservation.
CREATE TABLE pool_capacity_nodes_v1 (
    node_id text PRIMARY KEY,
    pool_id text NOT NULL,
    pool_owner_tenant_id text NOT NULL,
    resource text NOT NULL,
    atoms integer NOT NULL,
    role text NOT NULL,
    trust text NOT NULL,
    owner_tenant_id text,
    provision_state text NOT NULL,
    connectivity text NOT NULL,
    no_schedule_reasons text[] NOT NULL,
    observed_generation bigint NOT NULL,
    maintenance boolean NOT NULL,
    cordoned boolean NOT NULL,
    schedulable boolean NOT NULL
);
CREATE INDEX pool_capacity_nodes_v1_pool ON pool_capacity_nodes_v1 (pool_id, resource);
CREATE TABLE pool_capacity_holds_v1 (
    reservation_id text PRIMARY KEY,
    pool_id text NOT NULL,
    resource text NOT NULL,
    count integer NOT NULL,
    state text NOT NULL
);
CREATE INDEX pool_capacity_holds_v1_pool ON pool_capacity_holds_v1 (pool_id, resource);

-- Every recorded mutation with its admission context, and every recorded denial.
CREATE TABLE audit_events_v1 (
    log_epoch integer NOT NULL,
    txid xid8 NOT NULL,
    seq bigint NOT NULL,
    position text NOT NULL,
    stream_id text NOT NULL,
    stream_version integer NOT NULL,
    event_type text NOT NULL,
    tenant_id text,
    decision text NOT NULL CHECK (decision IN ('allowed', 'denied')),
    reason text,
    identity text,
    session_kind text,
    agent text,
    delegation text,
    request_id text,
    admission_tenant_id text,
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (log_epoch, txid, seq)
);
CREATE INDEX audit_events_v1_tenant ON audit_events_v1 (tenant_id, log_epoch, txid, seq);
CREATE INDEX audit_events_v1_stream ON audit_events_v1 (stream_id, stream_version);
