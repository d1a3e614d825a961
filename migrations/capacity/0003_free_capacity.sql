-- Placement in the order of the request, not of the pool. The first two pieces are inline state, kept by the
-- inline projections in the command's transaction and rebuilt from the log; the third is a hint over them:
--
-- * `device_bookings.live`: the booking still holds its atom (its reservation has not ended and it was not
--   replaced). An ending truncates a booking to its end and clears `live`; every read that asks what is booked
--   from now on reads live bookings only, through partial indexes that stay as small as what is booked now
--   rather than growing with the history.
-- * `devices.booked_until`: the latest end of the atom's live bookings, NULL when it has none. An atom whose
--   `booked_until` is NULL or not after a window's start is free over the whole window, whatever its length. An
--   atom booked only later than a window is free over it too, but not found this way (placement then falls
--   back to the exact query).
-- * `node_free`: one row per node and atom class, how many bookable atoms it has and how many have no live
--   booking, in an index that placement reads best fit first, stopping at the first nodes whose atoms fit.
--
-- The exclusion constraint stays the guard; the summary only says where to look.

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

-- Not an inline table: an ordering hint over `devices`, moved right after each commit that booked or freed a node's
-- atoms and recounted after one that changed its devices (in the same round trip as the COMMIT, at read
-- committed, so it never conflicts with a command), and remade whole by `rebuild_free_capacity`. A stale row only changes the order placement reads nodes in:
-- whether an atom is free is always decided from `devices.booked_until` in the command's own snapshot.
CREATE TABLE node_free (
    node_id text NOT NULL,
    class text NOT NULL,
    pool_id text NOT NULL,
    atoms integer NOT NULL,
    free integer NOT NULL,
    PRIMARY KEY (node_id, class)
);
CREATE INDEX node_free_best_fit ON node_free (pool_id, class, free, node_id);
-- A recount reads one node's devices.
CREATE INDEX devices_node ON devices (node_id);

-- Recounts the summary rows of the given nodes from their devices (an atom counts as free when it has no live
-- booking): each node class's row is written again, added or removed as its bookable atoms say. Runs right after
-- the COMMIT of a node's change, so it must never fail the caller (its error would read as the commit's): a
-- recount lost to an error is made by the next change. Its own commit does not wait for the disk: a hint lost in
-- a crash only costs the order placement reads nodes in until the next recount.
CREATE FUNCTION summarize_nodes(p_nodes text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
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
    INSERT INTO node_free AS f (node_id, class, pool_id, atoms, free)
    SELECT c.node_id, c.class, c.pool_id, c.atoms, c.free
    FROM counted AS c
    ORDER BY c.node_id, c.class
    ON CONFLICT (node_id, class) DO NOTHING;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'summarize_nodes: % (%)', SQLERRM, SQLSTATE;
END
$$;

-- Moves the free counts of node classes by what a committed change booked or freed: `p_deltas` is a JSON array of
-- [node, class, change] as the inline projections return them. Runs after the COMMIT, like summarize_nodes.
CREATE FUNCTION adjust_free(p_deltas jsonb) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE node_free AS f SET free = greatest(0, least(f.atoms, f.free + u.delta))
    FROM (SELECT e ->> 0 AS node_id, e ->> 1 AS class, (e ->> 2)::int AS delta
          FROM jsonb_array_elements(p_deltas) AS e) AS u
    WHERE f.node_id = u.node_id AND f.class = u.class;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'adjust_free: % (%)', SQLERRM, SQLSTATE;
END
$$;

-- Brings `booked_until` of the given devices up to date with their live bookings.
CREATE FUNCTION refresh_booked_until(p_devices text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE devices AS d SET booked_until = l.until
    FROM (
        SELECT u.id, (SELECT max(upper(b.during)) FROM device_bookings AS b WHERE b.device_id = u.id AND b.live) AS until
        FROM unnest(p_devices) AS u(id)
    ) AS l
    WHERE d.id = l.id AND d.booked_until IS DISTINCT FROM l.until;
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

-- Locks the devices whose bookings this transaction is about to change, in id order (the lock order), bumps
-- their `booking_changes` (see devices.booking_changes) and, when the bookings reach `p_until_ms`, their
-- `booked_until` with it. Returns how the free counts of their nodes' classes change, for adjust_free.
CREATE FUNCTION touch_for_booking(p_devices text[], p_until_ms bigint) RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_deltas jsonb;
BEGIN
    WITH locked AS (
        SELECT id, booked_until IS NULL AS was_free FROM devices WHERE id = ANY(p_devices) ORDER BY id FOR UPDATE
    ), touched AS (
        UPDATE devices AS d
           SET booking_changes = d.booking_changes + 1,
               booked_until = CASE WHEN p_until_ms IS NULL THEN d.booked_until
                                   ELSE greatest(d.booked_until, ms_ts(p_until_ms)) END
        FROM locked
        WHERE d.id = locked.id
        RETURNING d.node_id, d.class, (d.booked_until IS NULL)::int - locked.was_free::int AS delta
    )
    SELECT coalesce(jsonb_agg(jsonb_build_array(c.node_id, c.class, c.delta) ORDER BY c.node_id, c.class), '[]')
      INTO v_deltas
    FROM (SELECT node_id, class, sum(delta)::int AS delta FROM touched GROUP BY node_id, class) AS c
    WHERE c.delta <> 0;
    RETURN v_deltas;
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

-- The inline projection of `reservation.placed`, in one call: the reservation row, its atoms locked in id order
-- and their ends of live bookings raised, its allocations and its bookings. Returns the free counts' changes.
CREATE FUNCTION inline_placed(
    p_id text, p_start_ms bigint, p_end_ms bigint, p_lease_ms bigint,
    p_alloc_ids text[], p_alloc_nodes text[], p_alloc_devices text[], p_devices text[], p_booking_allocs text[])
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_tenant text;
    v_pool text;
    v_resource text;
    v_deltas jsonb;
BEGIN
    UPDATE reservations
       SET state = 'placed', start_at = ms_ts(p_start_ms), end_at = ms_ts(p_end_ms),
           lease_deadline = ms_ts(p_lease_ms), version = version + 1
     WHERE id = p_id
    RETURNING tenant_id, pool_id, resource INTO STRICT v_tenant, v_pool, v_resource;
    v_deltas := touch_for_booking(p_devices, p_end_ms);
    PERFORM book_atoms(p_id, v_tenant, v_pool, v_resource, p_start_ms, p_end_ms, p_alloc_ids, p_alloc_nodes,
                       p_alloc_devices, p_devices, p_booking_allocs);
    RETURN v_deltas;
END
$$;

-- The inline projection of an ending (cancelled, released, expired, failed), in one call: the atoms of the
-- reservation's live bookings locked in id order (`booking_changes` bumped for those whose bookings reach past
-- the end) with their ends of live bookings recomputed without this reservation, the reservation row ended, and
-- its live bookings truncated at the end and no longer live. Returns the free counts' changes, for adjust_free.
CREATE FUNCTION inline_end(p_id text, p_state text, p_at_ms bigint, p_outcome text) RETURNS jsonb
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
        WHERE b.reservation_id = p_id AND b.live
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
                               WHERE b.device_id = d.id AND b.live AND b.reservation_id <> p_id)
        FROM locked
        WHERE d.id = locked.id
        RETURNING d.node_id, d.class, (d.booked_until IS NULL)::int - locked.was_free::int AS delta
    )
    SELECT count(*) > 0,
           coalesce(jsonb_agg(jsonb_build_array(c.node_id, c.class, c.delta) ORDER BY c.node_id, c.class)
                    FILTER (WHERE c.delta <> 0), '[]')
      INTO v_held, v_deltas
    FROM (SELECT node_id, class, sum(delta)::int AS delta FROM touched GROUP BY node_id, class) AS c;
    UPDATE reservations
       SET state = p_state, ended_at = v_at, outcome = p_outcome, version = version + 1
     WHERE id = p_id;
    IF v_held THEN
        UPDATE device_bookings
           SET during = CASE WHEN upper(during) > v_at THEN tstzrange(lower(during), greatest(lower(during), v_at))
                             ELSE during END,
               live = false
         WHERE reservation_id = p_id AND live;
    END IF;
    RETURN v_deltas;
END
$$;
