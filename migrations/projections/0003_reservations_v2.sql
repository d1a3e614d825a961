-- Version 2 of the reservations read model: each row holds the reservation as the domain's own fold of its
-- events (`folded`, the JSON of bc_domain::reservation::Reservation), beside the columns lists filter and
-- order on. Version 1 folded by hand and answered an outcome its reads by id did not (a cancel's reason);
-- its table stays until a later release drops it.
CREATE TABLE reservations_v2 (
    reservation_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    pool_id text NOT NULL,
    state text NOT NULL,
    requested_at timestamptz NOT NULL,
    folded jsonb NOT NULL
);
CREATE INDEX reservations_v2_tenant ON reservations_v2 (tenant_id, reservation_id);
CREATE INDEX reservations_v2_pool ON reservations_v2 (pool_id, state);
