-- The machines the control plane holds at external providers for provider pools: each acquired for one pending
-- reservation (its id is the acquire's idempotency key, so a retry never acquires twice), registered as a node of
-- the pool once the provider says it is ready, and released once the reservation it was acquired for is over and
-- nothing is booked on its node. The provider's own state is the truth about the machine; this table is what the
-- control plane asked for and made of it (the node itself is event-sourced like any other).
CREATE TABLE provider_machines (
    account_id text NOT NULL,
    machine_id text NOT NULL,
    pool_id text NOT NULL,
    reservation_id text NOT NULL UNIQUE,
    node_id text,
    state text NOT NULL CHECK (state IN ('acquiring', 'ready', 'released', 'failed')),
    detail text,
    acquired_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, machine_id)
);
CREATE INDEX provider_machines_pool ON provider_machines (pool_id) WHERE state IN ('acquiring', 'ready');
