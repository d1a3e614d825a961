-- Placement in the order of the request, not of the pool. Three pieces, all kept by the inline projections in
-- the command's transaction (and so rebuilt from the log like the rest of the inline tables):
--
-- * `device_bookings.live`: the booking still holds its atom (its reservation has not ended and it was not
--   replaced). An ending truncates a booking to its end and clears `live`; every read that asks what is booked
--   from now on reads live bookings only, through partial indexes that stay as small as what is booked now
--   rather than growing with the history.
-- * `devices.booked_until`: the latest end of the atom's live bookings, NULL when it has none. An atom whose
--   `booked_until` is NULL or not after a window's start is free over the whole window, whatever its length. An
--   atom booked only later than a window is free over it too, but not found this way (placement then falls
--   back to the exact query).
-- * `node_free`: one row per node and atom class: how many bookable atoms it has and how many have no live
--   booking. Placement reads it best fit first through an index and stops at the first nodes whose atoms fit.
--
-- The exclusion constraint stays the guard; the summary only says where to look. Lock order: quota_usage,
-- pools, nodes, node_free, devices, device_bookings, node_resources.

ALTER TABLE device_bookings ADD COLUMN live boolean NOT NULL DEFAULT true;
UPDATE device_bookings AS b SET live = false
FROM reservations AS r
WHERE r.id = b.reservation_id AND r.ended_at IS NOT NULL AND b.live;
UPDATE device_bookings SET live = false WHERE isempty(during) AND live;

-- The reads of bookings from now on (placement's exact query, the quota sweep, earliest start) ask for live
-- ones only; the end of one atom's live bookings is one probe of the third index.
DROP INDEX device_bookings_ends;
DROP INDEX device_bookings_holder;
CREATE INDEX device_bookings_ends ON device_bookings (pool_id, upper(during)) WHERE live;
CREATE INDEX device_bookings_holder ON device_bookings (tenant_id, pool_id, resource, upper(during)) WHERE live;
CREATE INDEX device_bookings_live ON device_bookings (device_id, upper(during)) WHERE live;

ALTER TABLE devices ADD COLUMN booked_until timestamptz;

CREATE TABLE node_free (
    node_id text NOT NULL,
    class text NOT NULL,
    pool_id text NOT NULL,
    atoms integer NOT NULL,
    free integer NOT NULL,
    PRIMARY KEY (node_id, class)
);
CREATE INDEX node_free_best_fit ON node_free (pool_id, class, free, node_id);

-- Recounts the summary rows of the given nodes from their devices: only rows whose counts changed are written
-- (an unchanged row is neither locked nor updated, so it never conflicts with a concurrent command), a node
-- class without bookable atoms loses its row, and a new one gets its row.
CREATE FUNCTION recount_free(p_nodes text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    WITH counted AS (
        SELECT d.node_id, d.class, min(d.pool_id) AS pool_id, count(*)::int AS atoms,
               (count(*) FILTER (WHERE d.booked_until IS NULL))::int AS free
        FROM devices AS d
        WHERE d.node_id = ANY(p_nodes) AND d.bookable
        GROUP BY d.node_id, d.class
    ), gone AS (
        DELETE FROM node_free AS f
        WHERE f.node_id = ANY(p_nodes)
          AND NOT EXISTS (SELECT 1 FROM counted AS c WHERE c.node_id = f.node_id AND c.class = f.class)
    ), changed AS (
        UPDATE node_free AS f SET pool_id = c.pool_id, atoms = c.atoms, free = c.free
        FROM counted AS c
        WHERE f.node_id = c.node_id AND f.class = c.class
          AND (f.pool_id, f.atoms, f.free) IS DISTINCT FROM (c.pool_id, c.atoms, c.free)
    )
    INSERT INTO node_free (node_id, class, pool_id, atoms, free)
    SELECT c.node_id, c.class, c.pool_id, c.atoms, c.free
    FROM counted AS c
    WHERE NOT EXISTS (SELECT 1 FROM node_free AS f WHERE f.node_id = c.node_id AND f.class = c.class)
    ORDER BY c.node_id, c.class;
END
$$;

-- Brings `booked_until` of the given devices up to date with their live bookings, then recounts the summary
-- rows of their nodes and of `p_nodes` (the nodes of devices that are gone).
CREATE FUNCTION refresh_free(p_devices text[], p_nodes text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE devices AS d SET booked_until = l.until
    FROM (
        SELECT u.id, (SELECT max(upper(b.during)) FROM device_bookings AS b WHERE b.device_id = u.id AND b.live) AS until
        FROM unnest(p_devices) AS u(id)
    ) AS l
    WHERE d.id = l.id AND d.booked_until IS DISTINCT FROM l.until;
    PERFORM recount_free(ARRAY(
        SELECT DISTINCT x.node_id
        FROM (SELECT d.node_id FROM devices AS d WHERE d.id = ANY(p_devices) UNION SELECT unnest(p_nodes)) AS x
        ORDER BY x.node_id
    ));
END
$$;

-- The whole summary from the bookings and devices (after a bulk load, and here for what is already there).
CREATE FUNCTION rebuild_free_capacity() RETURNS void
LANGUAGE sql
AS $$
    UPDATE devices AS d SET booked_until = l.until
    FROM (
        SELECT d2.id, b.until
        FROM devices AS d2
        LEFT JOIN (SELECT device_id, max(upper(during)) AS until FROM device_bookings WHERE live GROUP BY device_id)
             AS b ON b.device_id = d2.id
    ) AS l
    WHERE d.id = l.id AND d.booked_until IS DISTINCT FROM l.until;
    DELETE FROM node_free;
    INSERT INTO node_free (node_id, class, pool_id, atoms, free)
    SELECT d.node_id, d.class, min(d.pool_id), count(*)::int, (count(*) FILTER (WHERE d.booked_until IS NULL))::int
    FROM devices AS d
    WHERE d.bookable
    GROUP BY d.node_id, d.class;
$$;

SELECT rebuild_free_capacity();

-- Locks what a change to bookings of `p_devices` on `p_nodes` writes, in the lock order: the nodes' summary rows,
-- then the devices in id order, whose `booking_changes` it bumps (see devices.booking_changes).
CREATE FUNCTION touch_for_booking(p_nodes text[], p_devices text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM node_free WHERE node_id = ANY(p_nodes) ORDER BY node_id, class FOR UPDATE;
    UPDATE devices AS d SET booking_changes = d.booking_changes + 1
    FROM (SELECT id FROM devices WHERE id = ANY(p_devices) ORDER BY id FOR UPDATE) AS locked
    WHERE d.id = locked.id;
END
$$;

-- Writes a reservation's allocations and books their atoms for [start, end). `p_alloc_devices` holds each
-- allocation's devices as a JSON array; `p_devices` and `p_booking_allocs` the booked atoms in device id order
-- (the order every transaction books them in) with their allocations.
CREATE FUNCTION book_atoms(
    p_id text, p_tenant text, p_pool text, p_resource text, p_start_ms bigint, p_end_ms bigint,
    p_alloc_ids text[], p_alloc_nodes text[], p_alloc_devices text[], p_devices text[], p_booking_allocs text[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO allocations (id, reservation_id, node_id, devices)
    SELECT u.id, p_id, u.node_id, ARRAY(SELECT jsonb_array_elements_text(u.devices::jsonb))
    FROM unnest(p_alloc_ids, p_alloc_nodes, p_alloc_devices) AS u(id, node_id, devices);
    INSERT INTO device_bookings (device_id, allocation_id, reservation_id, tenant_id, pool_id, resource, during)
    SELECT u.device_id, u.allocation_id, p_id, p_tenant, p_pool, p_resource,
           tstzrange(ms_ts(p_start_ms), ms_ts(p_end_ms))
    FROM unnest(p_devices, p_booking_allocs) WITH ORDINALITY AS u(device_id, allocation_id, ord)
    ORDER BY u.ord;
END
$$;

-- The inline projection of `reservation.placed`, in one call: the reservation row, the summary rows of its nodes
-- and its atoms locked in the lock order, its allocations and bookings, and the summary brought up to date.
CREATE FUNCTION inline_placed(
    p_id text, p_start_ms bigint, p_end_ms bigint, p_lease_ms bigint,
    p_alloc_ids text[], p_alloc_nodes text[], p_alloc_devices text[], p_devices text[], p_booking_allocs text[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_tenant text;
    v_pool text;
    v_resource text;
BEGIN
    UPDATE reservations
       SET state = 'placed', start_at = ms_ts(p_start_ms), end_at = ms_ts(p_end_ms),
           lease_deadline = ms_ts(p_lease_ms), version = version + 1
     WHERE id = p_id
    RETURNING tenant_id, pool_id, resource INTO STRICT v_tenant, v_pool, v_resource;
    PERFORM touch_for_booking(p_alloc_nodes, p_devices);
    PERFORM book_atoms(p_id, v_tenant, v_pool, v_resource, p_start_ms, p_end_ms, p_alloc_ids, p_alloc_nodes,
                       p_alloc_devices, p_devices, p_booking_allocs);
    PERFORM refresh_free(p_devices, '{}');
END
$$;

-- The inline projection of an ending (cancelled, released, expired, failed), in one call: the summary rows of the
-- reservation's nodes and the atoms whose bookings reach past the end locked, the reservation row ended, its
-- live bookings truncated at the end and no longer live, and the summary brought up to date.
CREATE FUNCTION inline_end(p_id text, p_state text, p_at_ms bigint, p_outcome text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_devices text[];
BEGIN
    SELECT array_agg(b.device_id ORDER BY b.device_id) INTO v_devices
    FROM device_bookings AS b WHERE b.reservation_id = p_id AND b.live;
    IF v_devices IS NOT NULL THEN
        PERFORM touch_for_booking(
            ARRAY(SELECT a.node_id FROM allocations AS a WHERE a.reservation_id = p_id),
            ARRAY(SELECT b.device_id FROM device_bookings AS b
                  WHERE b.reservation_id = p_id AND b.live AND upper(b.during) > ms_ts(p_at_ms)));
    END IF;
    UPDATE reservations
       SET state = p_state, ended_at = ms_ts(p_at_ms), outcome = p_outcome, version = version + 1
     WHERE id = p_id;
    IF v_devices IS NOT NULL THEN
        UPDATE device_bookings
           SET during = CASE WHEN upper(during) > ms_ts(p_at_ms)
                             THEN tstzrange(lower(during), greatest(lower(during), ms_ts(p_at_ms)))
                             ELSE during END,
               live = false
         WHERE reservation_id = p_id AND live;
        PERFORM refresh_free(v_devices, '{}');
    END IF;
END
$$;
