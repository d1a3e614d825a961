-- The capacity module's inline projections: tables updated in the command's own transaction, from its events,
-- and rebuildable from the log. The booking exclusion constraint is the one write-side guard that is not an
-- event: two overlapping bookings of one device can never both commit.

-- Epoch milliseconds to and from timestamptz, exactly (inlined by the planner).
CREATE FUNCTION ms_ts(ms bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT timestamptz 'epoch' + ms * interval '1 millisecond' $$;

CREATE FUNCTION ts_ms(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT floor(extract(epoch FROM ts) * 1000)::bigint $$;

CREATE TABLE sites (
    id text PRIMARY KEY,
    owner_tenant_id text NOT NULL,
    name text NOT NULL,
    iam_region text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('shared', 'dedicated', 'custom')),
    created_at timestamptz NOT NULL,
    UNIQUE (owner_tenant_id, name)
);

CREATE TABLE pools (
    id text PRIMARY KEY,
    site_id text NOT NULL,
    owner_tenant_id text NOT NULL,
    name text NOT NULL,
    class text NOT NULL,
    gpu_model text NOT NULL,
    sharing text NOT NULL,
    agent text NOT NULL,
    policy jsonb NOT NULL,
    provider_account_id text,
    created_at timestamptz NOT NULL,
    UNIQUE (owner_tenant_id, name)
);

-- An offering makes a pool exist in another tenant's view, with a quota per resource.
CREATE TABLE pool_offers (
    pool_id text NOT NULL,
    tenant_id text NOT NULL,
    quota jsonb NOT NULL,
    priority integer NOT NULL,
    include_descendants boolean NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (pool_id, tenant_id)
);

CREATE TABLE projects (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE nodes (
    id text PRIMARY KEY,
    pool_id text NOT NULL,
    site_id text NOT NULL,
    owner_tenant_id text,
    name text NOT NULL,
    role text NOT NULL,
    trust text NOT NULL,
    adapter text NOT NULL,
    provision_state text NOT NULL,
    maintenance boolean NOT NULL DEFAULT false,
    cordoned boolean NOT NULL DEFAULT false,
    power text NOT NULL DEFAULT 'unknown',
    connectivity text NOT NULL,
    conditions jsonb NOT NULL DEFAULT '[]',
    no_schedule_reasons text[] NOT NULL DEFAULT '{}',
    generation bigint NOT NULL,
    observed_generation bigint NOT NULL,
    -- The schedulability rule over the axes above, kept with them so placement can filter on it.
    schedulable boolean NOT NULL,
    registered_at timestamptz NOT NULL,
    UNIQUE (pool_id, name)
);

CREATE TABLE devices (
    id text PRIMARY KEY,
    node_id text NOT NULL,
    pool_id text NOT NULL,
    class text NOT NULL,
    parent_id text,
    bookable boolean NOT NULL,
    gpu_model text NOT NULL,
    gpu_product text NOT NULL,
    attributes jsonb NOT NULL DEFAULT '{}',
    -- Bumped by every change to the device's bookings, before the bookings themselves. Two repeatable-read
    -- transactions that change bookings of one device then conflict on this row, and the later one is refused
    -- (40001, retried) unless its snapshot saw the earlier one: so a booking never depends on a change its
    -- transaction could not see, and replaying the log in order never trips the exclusion constraint.
    booking_changes bigint NOT NULL DEFAULT 0
);
CREATE INDEX devices_atoms ON devices (pool_id, class, node_id) WHERE bookable;

-- One row per booked atom. Ranges are half-open [start, end); every ending of a reservation truncates them to
-- [start, greatest(start, end time)), which is empty when it never began. History lives in the events.
CREATE TABLE device_bookings (
    device_id text NOT NULL,
    allocation_id text NOT NULL,
    reservation_id text NOT NULL,
    tenant_id text NOT NULL,
    pool_id text NOT NULL,
    resource text NOT NULL,
    during tstzrange NOT NULL,
    PRIMARY KEY (allocation_id, device_id),
    CONSTRAINT device_bookings_no_overlap EXCLUDE USING gist (device_id WITH =, during WITH &&)
);
CREATE INDEX device_bookings_reservation ON device_bookings (reservation_id);
CREATE INDEX device_bookings_tenant ON device_bookings USING gist (tenant_id, pool_id, resource, during);
CREATE INDEX device_bookings_pool ON device_bookings USING gist (pool_id, during);

-- One row per (tenant, pool, resource) that serializes the tenant's quota checks in the pool. First in the lock
-- order: quota_usage, pools, nodes, devices, device_bookings, node_resources. Every check updates the row, not
-- only locks it: a repeatable-read command took its snapshot before it waited for the lock, and only an update
-- makes PostgreSQL refuse (40001, retried) a command whose snapshot missed the bookings of the one before it.
CREATE TABLE quota_usage (
    tenant_id text NOT NULL,
    pool_id text NOT NULL,
    resource text NOT NULL,
    checks bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, pool_id, resource)
);

CREATE TABLE reservations (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    identity text NOT NULL,
    pool_id text NOT NULL,
    project_id text,
    state text NOT NULL,
    resource text NOT NULL,
    count integer NOT NULL,
    request jsonb NOT NULL,
    request_hash text NOT NULL,
    priority integer NOT NULL,
    requested_at timestamptz NOT NULL,
    pending_deadline timestamptz NOT NULL,
    start_at timestamptz,
    end_at timestamptz,
    lease_deadline timestamptz,
    release_requested_at timestamptz,
    ended_at timestamptz,
    outcome text,
    version integer NOT NULL
);
CREATE INDEX reservations_pending ON reservations (pool_id, priority DESC, requested_at, id) WHERE state = 'pending';
CREATE INDEX reservations_tenant ON reservations (tenant_id, id);

CREATE TABLE allocations (
    id text PRIMARY KEY,
    reservation_id text NOT NULL,
    node_id text NOT NULL,
    devices text[] NOT NULL
);
CREATE INDEX allocations_reservation ON allocations (reservation_id);
