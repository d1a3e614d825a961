-- Version 2 of the pools and nodes read models: each row holds the aggregate as the domain's own fold of its
-- stream (`folded`, the JSON of bc_domain::pool::Pool or bc_domain::node::Node), beside the columns reads
-- filter on. Version 1 folded each by hand; its tables stay until a later release drops them.
CREATE TABLE pools_v2 (
    pool_id text PRIMARY KEY,
    owner_tenant_id text NOT NULL,
    -- The tenants it is offered to: with the owner, who sees it.
    offer_tenants text[] NOT NULL DEFAULT '{}',
    node_count integer NOT NULL DEFAULT 0,
    folded jsonb NOT NULL
);
CREATE INDEX pools_v2_owner ON pools_v2 (owner_tenant_id, pool_id);
CREATE INDEX pools_v2_offers ON pools_v2 USING gin (offer_tenants);

CREATE TABLE nodes_v2 (
    node_id text PRIMARY KEY,
    pool_id text NOT NULL,
    -- The tenant that owns the node's pool: it reads the node, and the trust rule compares with it.
    pool_owner_tenant_id text NOT NULL,
    folded jsonb NOT NULL
);
CREATE INDEX nodes_v2_pool ON nodes_v2 (pool_owner_tenant_id, pool_id, node_id);
