-- Scalar resources: the vCPUs, memory and disk a node has, and the amounts of them an allocation holds beside its
-- atoms.
--
-- `node_resources` is what each node reported (`node.resources_changed`): its capacity before the pool's overcommit,
-- which the command multiplies by the pool's ratio when it places (a ratio changed later applies to the next
-- placement; what is held stays). It comes last in the lock order (quota_usage, pools, nodes, devices,
-- device_bookings, node_resources): a placement that books scalars locks the rows of its chosen nodes for update
-- after their atoms, and updates them, so that at repeatable read a concurrent placement on the same node that
-- committed since this snapshot refuses this one (40001, retried) rather than both passing a check that each made
-- without the other's bookings.
--
-- `scalar_bookings` holds one row per allocation and resource, with the reservation's window, while the
-- reservation holds its atoms; an ending deletes them with its device bookings (`inline_end` below), a
-- replacement books the new allocations' amounts in place of the old, an extension lengthens them. Unlike atoms,
-- amounts add up, so no exclusion constraint can guard them: the lock above does, with the sweeps below.

CREATE TABLE node_resources (
    node_id text NOT NULL,
    resource text NOT NULL,
    capacity bigint NOT NULL CHECK (capacity >= 0),
    PRIMARY KEY (node_id, resource)
);

CREATE TABLE scalar_bookings (
    allocation_id text NOT NULL,
    reservation_id text NOT NULL,
    node_id text NOT NULL,
    tenant_id text NOT NULL,
    pool_id text NOT NULL,
    resource text NOT NULL,
    amount bigint NOT NULL CHECK (amount > 0),
    during tstzrange NOT NULL,
    PRIMARY KEY (allocation_id, resource)
);
CREATE INDEX scalar_bookings_node ON scalar_bookings USING gist (node_id, resource, during);
CREATE INDEX scalar_bookings_tenant ON scalar_bookings USING gist (tenant_id, pool_id, resource, during);
CREATE INDEX scalar_bookings_reservation ON scalar_bookings (reservation_id);

ALTER TABLE scalar_bookings SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- A node's reported scalars, replacing what it had: `p_resources` is a JSON object of resource to amount.
CREATE FUNCTION set_node_resources(p_node text, p_resources jsonb) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM node_resources
     WHERE node_id = p_node AND NOT p_resources ? resource;
    INSERT INTO node_resources (node_id, resource, capacity)
    SELECT p_node, e.key, e.value::bigint FROM jsonb_each_text(p_resources) AS e
    ON CONFLICT (node_id, resource) DO UPDATE SET capacity = excluded.capacity
     WHERE node_resources.capacity IS DISTINCT FROM excluded.capacity;
END
$$;

-- Books a reservation's scalar amounts over its window: `p_rows` is a JSON array of [allocation, node, resource,
-- amount].
CREATE FUNCTION book_scalars(p_reservation text, p_start_ms bigint, p_end_ms bigint, p_rows jsonb) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO scalar_bookings (allocation_id, reservation_id, node_id, tenant_id, pool_id, resource, amount, during)
    SELECT e ->> 0, p_reservation, e ->> 1, r.tenant_id, r.pool_id, e ->> 2, (e ->> 3)::bigint,
           tstzrange(ms_ts(p_start_ms), ms_ts(p_end_ms))
    FROM jsonb_array_elements(p_rows) AS e, reservations AS r
    WHERE r.id = p_reservation;
$$;

-- The chosen nodes' scalar rows, locked for update in the lock order and updated (see above).
CREATE FUNCTION lock_node_resources(p_nodes text[], p_resources text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM node_resources
     WHERE node_id = ANY (p_nodes) AND resource = ANY (p_resources)
     ORDER BY node_id, resource
       FOR UPDATE;
    UPDATE node_resources SET capacity = capacity
     WHERE node_id = ANY (p_nodes) AND resource = ANY (p_resources);
END
$$;

-- What the nodes have of each resource and the most their bookings hold at any instant of [start, end), leaving out
-- reservation `p_exclude`'s own (a replacement's): one row per (node, resource) the node reports. A booking that
-- ends at an instant does not overlap one that starts at it.
CREATE FUNCTION node_scalar_peaks(p_nodes text[], p_resources text[], p_start_ms bigint, p_end_ms bigint,
                                  p_exclude text)
RETURNS TABLE (node_id text, resource text, capacity bigint, peak bigint)
LANGUAGE sql
STABLE
AS $$
    SELECT n.node_id, n.resource, n.capacity,
           coalesce((
               SELECT max(running) FROM (
                   SELECT sum(s.delta) OVER (ORDER BY s.at, s.delta ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                          AS running
                   FROM scalar_bookings AS b,
                        LATERAL (VALUES (greatest(lower(b.during), ms_ts(p_start_ms)), b.amount),
                                        (least(upper(b.during), ms_ts(p_end_ms)), -b.amount)) AS s(at, delta)
                   WHERE b.node_id = n.node_id AND b.resource = n.resource
                     AND b.during && tstzrange(ms_ts(p_start_ms), ms_ts(p_end_ms))
                     AND b.reservation_id IS DISTINCT FROM p_exclude
               ) AS sweep), 0)::bigint AS peak
    FROM node_resources AS n
    WHERE n.node_id = ANY (p_nodes) AND n.resource = ANY (p_resources);
$$;

-- The most of `p_resource` the tenant's bookings in the pool hold at any instant of [start, end), leaving out
-- reservation `p_exclude`'s own.
CREATE FUNCTION tenant_scalar_peak(p_tenant text, p_pool text, p_resource text, p_start_ms bigint, p_end_ms bigint,
                                   p_exclude text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(max(running), 0)::bigint FROM (
        SELECT sum(s.delta) OVER (ORDER BY s.at, s.delta ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
        FROM scalar_bookings AS b,
             LATERAL (VALUES (greatest(lower(b.during), ms_ts(p_start_ms)), b.amount),
                             (least(upper(b.during), ms_ts(p_end_ms)), -b.amount)) AS s(at, delta)
        WHERE b.tenant_id = p_tenant AND b.pool_id = p_pool AND b.resource = p_resource
          AND b.during && tstzrange(ms_ts(p_start_ms), ms_ts(p_end_ms))
          AND b.reservation_id IS DISTINCT FROM p_exclude
    ) AS sweep;
$$;

-- The pool's nodes that report at least each amount of `p_amounts` (a JSON object of resource to amount) once the
-- pool's overcommit (`p_ratios`, resource to ratio) multiplies what they have: the nodes that could ever hold one
-- allocation's scalars.
CREATE FUNCTION nodes_with_scalars(p_pool text, p_amounts jsonb, p_ratios jsonb) RETURNS text[]
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(array_agg(n.id ORDER BY n.id), '{}')
    FROM nodes AS n
    WHERE n.pool_id = p_pool
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each_text(p_amounts) AS want
          WHERE coalesce((SELECT floor(r.capacity * coalesce((p_ratios ->> want.key)::float8, 1.0))
                          FROM node_resources AS r WHERE r.node_id = n.id AND r.resource = want.key), 0)
                < want.value::bigint);
$$;

-- An ending also deletes the reservation's scalar bookings.
CREATE OR REPLACE FUNCTION inline_end(p_id text, p_state text, p_at_ms bigint, p_outcome text) RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_at timestamptz := ms_ts(p_at_ms);
    v_held boolean;
    v_deltas jsonb;
BEGIN
    WITH mine AS (
        SELECT b.device_id, bool_or(upper(b.during) > v_at) AS reaches
        FROM device_bookings AS b
        WHERE b.reservation_id = p_id
        GROUP BY b.device_id
    ), locked AS (
        SELECT d.id, mine.reaches, d.booked_until IS NULL AS was_free
        FROM devices AS d JOIN mine ON mine.device_id = d.id
        ORDER BY d.id
        FOR UPDATE OF d
    ), touched AS (
        UPDATE devices AS d
           SET booking_changes = d.booking_changes + CASE WHEN locked.reaches THEN 1 ELSE 0 END,
               booked_until = (SELECT max(upper(b.during)) FROM device_bookings AS b
                               WHERE b.device_id = d.id AND b.reservation_id <> p_id)
        FROM locked
        WHERE d.id = locked.id
        RETURNING d.node_id, d.class, (d.booked_until IS NULL)::int - locked.was_free::int AS delta
    )
    SELECT count(*) > 0,
           coalesce(jsonb_agg(jsonb_build_array(c.node_id, c.class, c.delta) ORDER BY c.node_id, c.class), '[]')
      INTO v_held, v_deltas
    FROM (SELECT node_id, class, sum(delta)::int AS delta FROM touched GROUP BY node_id, class) AS c;
    UPDATE reservations
       SET state = p_state, ended_at = v_at, outcome = p_outcome, version = version + 1
     WHERE id = p_id;
    IF v_held THEN
        DELETE FROM device_bookings WHERE reservation_id = p_id;
        DELETE FROM scalar_bookings WHERE reservation_id = p_id;
    END IF;
    RETURN v_deltas;
END
$$;
