-- Free time per atom: placement for any window in O(what is free then), not O(what is booked).
--
-- The summary (`node_free`, `devices.booked_until`) finds atoms with nothing booked after a window's start; an
-- atom booked later than the window is free over it too, but the summary cannot tell. Calendars that book every
-- atom ahead (advance reservations laid end to end) left it nothing to offer, and placement fell back to reading
-- every live booking of the pool that ends after the window's start, tens of thousands of rows in a pool of a
-- thousand nodes, to keep the few that overlap.
--
-- `atom_gaps` holds the complement of the live bookings: for every bookable atom, each maximal interval in which
-- none of its live bookings holds it (one unbounded interval for an atom with none). An atom is free over
-- [start, end) exactly when one of its gaps contains that window, which the GiST index answers reading only the
-- gaps that do. It is derived state, like an index: triggers keep it equal to what `device_bookings` and
-- `devices` say, in the statement that changes them and under the locks that change takes (every change of an
-- atom's bookings locks the atom's `devices` row first), so it is exact in every snapshot; a rebuild from the log
-- rebuilds the bookings, and `rebuild_atom_gaps` remakes it from them. The exclusion constraint stays the guard.

CREATE TABLE atom_gaps (
    device_id text NOT NULL,
    node_id text NOT NULL,
    pool_id text NOT NULL,
    class text NOT NULL,
    gap tstzrange NOT NULL CHECK (NOT isempty(gap))
);
CREATE INDEX atom_gaps_free ON atom_gaps USING gist (pool_id, class, gap);
CREATE INDEX atom_gaps_device ON atom_gaps (device_id);

-- What the gaps of the given atoms should be, from their live bookings: each booking's bounds and one sentinel per
-- atom past its last booking (a NULL start sorts last), paired with the end of the booking before. An atom that
-- is not bookable, or no longer exists, has none. One SELECT and STABLE, so the planner inlines it into the
-- statement that reads it.
CREATE FUNCTION atom_gaps_of(p_devices text[])
RETURNS TABLE (device_id text, node_id text, pool_id text, class text, gap tstzrange)
LANGUAGE sql
STABLE
AS $$
    SELECT e.device_id, d.node_id, d.pool_id, d.class, e.gap
    FROM (
        SELECT edges.device_id,
               tstzrange(lag(edges.hi) OVER (PARTITION BY edges.device_id ORDER BY edges.lo NULLS LAST), edges.lo)
                   AS gap
        FROM (
            SELECT b.device_id, lower(b.during) AS lo, upper(b.during) AS hi
            FROM device_bookings AS b
            WHERE b.device_id = ANY(p_devices) AND b.live AND NOT isempty(b.during)
            UNION ALL
            SELECT u.id, NULL, NULL FROM (SELECT DISTINCT unnest(p_devices) AS id) AS u
        ) AS edges
    ) AS e
    JOIN devices AS d ON d.id = e.device_id AND d.bookable
    WHERE NOT isempty(e.gap);
$$;

-- Makes the gaps of the given atoms what `atom_gaps_of` says, writing only the rows that change: booking an atom
-- for a window inside one gap replaces that gap by what is left on either side, ending a booking merges the gaps
-- around it. PL/pgSQL, so the statement's plan is kept for the session (a booking statement's trigger runs it);
-- the atoms go through it 64 at a time, so that plan (made for a few atoms) stays cheap for a bulk change of
-- thousands.
CREATE FUNCTION refresh_atom_gaps(p_devices text[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_all text[] := ARRAY(SELECT DISTINCT u.id FROM unnest(p_devices) AS u(id) ORDER BY u.id);
    v_atoms text[];
    v_from integer := 1;
BEGIN
    WHILE v_from <= coalesce(cardinality(v_all), 0) LOOP
        v_atoms := v_all[v_from:v_from + 63];
        v_from := v_from + 64;
        WITH want AS MATERIALIZED (
            SELECT * FROM atom_gaps_of(v_atoms)
        ), old AS MATERIALIZED (
            -- The rows there now, read once through the device index (probing the GiST index for each row
            -- wanted would cost milliseconds a row).
            SELECT g.ctid AS row_id, g.device_id, g.node_id, g.pool_id, g.class, g.gap
            FROM atom_gaps AS g
            WHERE g.device_id = ANY(v_atoms)
        ), gone AS (
            DELETE FROM atom_gaps AS g
            WHERE g.device_id = ANY(v_atoms)
              AND g.ctid IN (SELECT o.row_id FROM old AS o
                             WHERE NOT EXISTS (SELECT 1 FROM want AS w
                                               WHERE w.device_id = o.device_id AND w.gap = o.gap
                                                 AND w.node_id = o.node_id AND w.pool_id = o.pool_id
                                                 AND w.class = o.class))
        )
        INSERT INTO atom_gaps (device_id, node_id, pool_id, class, gap)
        SELECT w.device_id, w.node_id, w.pool_id, w.class, w.gap
        FROM want AS w
        WHERE NOT EXISTS (SELECT 1 FROM old AS o
                          WHERE o.device_id = w.device_id AND o.gap = w.gap AND o.node_id = w.node_id
                            AND o.pool_id = w.pool_id AND o.class = w.class);
    END LOOP;
END
$$;

-- What the whole table should hold: the rebuild's source, and what the torture test compares the table with.
CREATE FUNCTION atom_gaps_from_bookings()
RETURNS TABLE (device_id text, node_id text, pool_id text, class text, gap tstzrange)
LANGUAGE sql
STABLE
AS $$ SELECT * FROM atom_gaps_of(ARRAY(SELECT id FROM devices WHERE bookable)) $$;

-- The whole table again (after a bulk load, and here for what is already there).
CREATE FUNCTION rebuild_atom_gaps() RETURNS void
LANGUAGE sql
AS $$
    DELETE FROM atom_gaps;
    INSERT INTO atom_gaps (device_id, node_id, pool_id, class, gap) SELECT * FROM atom_gaps_from_bookings();
$$;

SELECT rebuild_atom_gaps();

-- The triggers, on statements, with the rows they changed: an insert's or a delete's as `changed`, an update's
-- before and after (a booking that moved to another atom changes both). A statement that changes no row refreshes
-- nothing.
CREATE FUNCTION atom_gaps_after_booking_change() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM refresh_atom_gaps(ARRAY(SELECT device_id FROM changed));
    RETURN NULL;
END
$$;

CREATE FUNCTION atom_gaps_after_booking_update() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM refresh_atom_gaps(ARRAY(SELECT device_id FROM old_rows UNION ALL SELECT device_id FROM new_rows));
    RETURN NULL;
END
$$;

CREATE TRIGGER atom_gaps_booking_insert AFTER INSERT ON device_bookings
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION atom_gaps_after_booking_change();
CREATE TRIGGER atom_gaps_booking_update AFTER UPDATE ON device_bookings
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION atom_gaps_after_booking_update();
CREATE TRIGGER atom_gaps_booking_delete AFTER DELETE ON device_bookings
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION atom_gaps_after_booking_change();

-- Devices: a new atom gets its gaps, a removed one loses them, and one whose node, pool, class or bookability
-- changes has them written again. The bookings' own updates of `devices` (booking_changes, booked_until) set none
-- of those columns, so they do not fire the update trigger.
CREATE FUNCTION atom_gaps_after_device_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM refresh_atom_gaps(ARRAY(SELECT id FROM new_rows));
    RETURN NULL;
END
$$;

CREATE FUNCTION atom_gaps_after_device_delete() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM atom_gaps WHERE device_id IN (SELECT id FROM old_rows);
    RETURN NULL;
END
$$;

CREATE FUNCTION atom_gaps_after_device_update() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM refresh_atom_gaps(ARRAY[NEW.id]);
    RETURN NULL;
END
$$;

CREATE TRIGGER atom_gaps_device_insert AFTER INSERT ON devices
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION atom_gaps_after_device_insert();
CREATE TRIGGER atom_gaps_device_delete AFTER DELETE ON devices
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION atom_gaps_after_device_delete();
CREATE TRIGGER atom_gaps_device_update AFTER UPDATE OF id, node_id, pool_id, class, bookable ON devices
    FOR EACH ROW
    WHEN ((OLD.id, OLD.node_id, OLD.pool_id, OLD.class, OLD.bookable)
          IS DISTINCT FROM (NEW.id, NEW.node_id, NEW.pool_id, NEW.class, NEW.bookable))
    EXECUTE FUNCTION atom_gaps_after_device_update();

-- Schedulable nodes of the pool with one node's share of matching atoms free over the whole window, at most
-- `p_limit`, best fit first (the fewest such atoms) among those read (`store::candidates`): the atoms are those
-- with a gap that contains the window, read through the GiST index. A request without a selector first reads only
-- the first `p_limit` × `p_per_node` of them in index order (which keeps a node's atoms booked together side by
-- side) and stops there when they make a quarter of `p_limit` fitting nodes (at least the request's node count,
-- as `store::exact_limit` is four per node of a gang); otherwise, and with a selector, it reads every free atom of
-- the pool over the window. Planned for each call's values.
CREATE OR REPLACE FUNCTION exact_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_window tstzrange := tstzrange(ms_ts(p_start_ms), ms_ts(p_end_ms));
    v_sampled jsonb;
BEGIN
    IF p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb THEN
        SELECT jsonb_agg(jsonb_build_array(c.node_id, c.free) ORDER BY c.n, c.node_id) INTO v_sampled
        FROM (
            SELECT f.node_id, array_agg(f.device_id ORDER BY f.device_id) AS free, count(*) AS n
            FROM (SELECT g.node_id, g.device_id FROM atom_gaps AS g
                  WHERE g.pool_id = p_pool AND g.class = p_class AND g.gap @> v_window
                  LIMIT p_limit * greatest(p_per_node, 1)) AS f
            JOIN nodes AS n ON n.id = f.node_id
            WHERE n.pool_id = p_pool AND n.schedulable
            GROUP BY f.node_id
            HAVING count(*) >= p_per_node
            ORDER BY count(*), f.node_id
            LIMIT p_limit
        ) AS c;
        IF coalesce(jsonb_array_length(v_sampled), 0) >= greatest(1, p_limit / 4) THEN
            RETURN QUERY
            SELECT e.value ->> 0, ARRAY(SELECT jsonb_array_elements_text(e.value -> 1))
            FROM jsonb_array_elements(v_sampled) WITH ORDINALITY AS e(value, ord)
            ORDER BY e.ord;
            RETURN;
        END IF;
    END IF;
    -- Every free atom of the pool over the window (too few fit among the first read, or a selector). Without a
    -- selector its test is planned away.
    RETURN QUERY
    SELECT g.node_id, array_agg(g.device_id ORDER BY g.device_id)
    FROM atom_gaps AS g JOIN nodes AS n ON n.id = g.node_id
    WHERE g.pool_id = p_pool AND g.class = p_class AND g.gap @> v_window
      AND n.pool_id = p_pool AND n.schedulable
      AND ((p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb)
           OR EXISTS (SELECT 1 FROM devices AS d
                      WHERE d.id = g.device_id
                        AND (p_model IS NULL OR d.gpu_model = p_model)
                        AND (p_product IS NULL OR d.gpu_product = p_product)
                        AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)))
    GROUP BY g.node_id
    HAVING count(*) >= p_per_node
    ORDER BY count(*), g.node_id
    LIMIT p_limit;
END
$$;

-- The quota sweep (`tenant_peak`) asks for a holder's live bookings that end after a window's start and begin
-- before its end. With the start in the index too, the bookings that begin later are skipped in the index rather
-- than read from the heap: a tenant with a calendar booked a month ahead has most of its bookings there.
CREATE INDEX device_bookings_holder_window
    ON device_bookings (tenant_id, pool_id, resource, upper(during), lower(during)) WHERE live;
DROP INDEX device_bookings_holder;
