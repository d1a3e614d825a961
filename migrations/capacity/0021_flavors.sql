-- Flavors: the shapes instances are made in (vCPUs, GiB of memory, GPUs, GiB of disk), a tenant's own or published
-- to every tenant. The inline table of `flavor.*` events; a deleted flavor's row goes (instances keep the sizes
-- they were made with), and its name is free again.
CREATE TABLE flavors (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    vcpu bigint NOT NULL,
    memory_gib bigint NOT NULL,
    gpus bigint NOT NULL,
    disk_gib bigint NOT NULL,
    visibility text NOT NULL,
    created_at timestamptz NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX flavors_public ON flavors (name) WHERE visibility = 'public';
