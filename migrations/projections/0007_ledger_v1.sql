-- Version 1 of the GPU-hour ledger: intervals, summed into UTC hours when read (`bc_projections::models::ledger`).
-- Times are epoch milliseconds, as the events carry them.
--
-- One row per reservation: its tenant, pool and atoms, the interval its atoms were booked (from its placement's
-- window, lengthened by extensions, cut short by its ending; NULL until placed) and the part of it the
-- reservation was active (`bound_from` at activation; `bound_to` at its release request or ending, NULL while
-- it runs on). `gpus` names the GPUs its atoms are on, `<node>/<gpu uuid>` (`<node>/*` for a whole machine), to
-- find the agents' utilization samples.
CREATE TABLE ledger_bookings_v1 (
    reservation_id text PRIMARY KEY,
    pool_id text NOT NULL,
    tenant_id text NOT NULL,
    atoms integer NOT NULL,
    booked_from bigint,
    booked_to bigint,
    bound_from bigint,
    bound_to bigint,
    gpus text[] NOT NULL DEFAULT '{}',
    CHECK (booked_from IS NULL OR booked_to >= booked_from)
);
-- The bookings of a pool that overlap a range of hours.
CREATE INDEX ledger_bookings_v1_window ON ledger_bookings_v1
    USING gist (pool_id, int8range(booked_from, booked_to)) WHERE booked_from IS NOT NULL;

-- A pool's capacity as segments of each node's atoms: opened when the node registers or joins, closed and opened
-- again when its hardware changes its number of atoms, closed when it is deleted (`to_ms` NULL while it stays).
CREATE TABLE ledger_capacity_v1 (
    node_id text NOT NULL,
    pool_id text NOT NULL,
    atoms integer NOT NULL,
    from_ms bigint NOT NULL,
    to_ms bigint,
    PRIMARY KEY (node_id, from_ms),
    CHECK (to_ms IS NULL OR to_ms > from_ms)
);
CREATE INDEX ledger_capacity_v1_pool ON ledger_capacity_v1 (pool_id, from_ms);
