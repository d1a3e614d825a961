-- Tenancy administered through the API, as inline tables of the tenant, identity, grant and limit events: the
-- tenants below the bootstrap file's with their state, identities and the SHA-256 of their bearer tokens (never
-- a token itself), pool relations granted to identities, and attribute limits on reservations in a pool.
CREATE TABLE tenants (
    id text PRIMARY KEY,
    parent_id text NOT NULL,
    name text NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'suspended')),
    suspended_reason text,
    created_at timestamptz NOT NULL
);
CREATE INDEX tenants_parent ON tenants (parent_id, id);

CREATE TABLE identities (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('user', 'service', 'agent')),
    admin boolean NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE identity_tokens (
    id text PRIMARY KEY,
    identity_id text NOT NULL,
    tenant_id text NOT NULL,
    sha256 text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL
);
CREATE INDEX identity_tokens_identity ON identity_tokens (identity_id, id);

CREATE TABLE pool_grants (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    identity text NOT NULL,
    pool text NOT NULL,
    relation text NOT NULL CHECK (relation IN ('viewer', 'user', 'operator', 'admin')),
    created_at timestamptz NOT NULL
);
CREATE INDEX pool_grants_tenant ON pool_grants (tenant_id, id);

CREATE TABLE attribute_limits (
    id text PRIMARY KEY,
    pool_id text NOT NULL,
    owner_tenant_id text NOT NULL,
    relation text NOT NULL CHECK (relation IN ('viewer', 'user', 'operator')),
    max_gpus integer,
    max_hours integer,
    created_at timestamptz NOT NULL
);
CREATE INDEX attribute_limits_pool ON attribute_limits (pool_id, id);
