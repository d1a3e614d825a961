-- Ended bookings leave `device_bookings`. An ending used to cut a booking short and clear `live`, and the row stayed
-- for good: every reservation ever placed kept its rows in the table, in its primary key, its reservation index and
-- the exclusion constraint's GiST index, which every new booking probes. The partial indexes already left such rows
-- out; the table and the GiST index did not. What a reservation held, and until when, is in its events (and in
-- `reservations` and `allocations`, which keep each placement's atoms and its start, end and end time).
--
-- Now an ending deletes its reservation's bookings, and a replacement deletes the old ones before it books the new:
-- the table holds exactly the bookings that still hold an atom, so its size follows what is booked now, not the
-- history, and an ending writes no new row version (an update of a booking's range put a new entry in every one of
-- its indexes, the GiST one included). Deleting is safe for the guard: an ended booking only ever covered time
-- before its end, which no placement can ask for again (a window starts at or after `compute_now()`).
--
-- `live` is true on every row from here on. It stays, with the partial indexes over it, until a later migration
-- restates the functions that name it.

DELETE FROM device_bookings WHERE NOT live;

-- The inline projection of an ending (cancelled, released, expired, failed), in one call: the atoms of the
-- reservation's bookings locked in id order (`booking_changes` bumped for those whose bookings reach past the end)
-- with their ends of live bookings recomputed without this reservation, the reservation row ended, and its bookings
-- deleted. Returns the free counts' changes, for adjust_free.
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
           coalesce(jsonb_agg(jsonb_build_array(c.node_id, c.class, c.delta) ORDER BY c.node_id, c.class)
                    FILTER (WHERE c.delta <> 0), '[]')
      INTO v_held, v_deltas
    FROM (SELECT node_id, class, sum(delta)::int AS delta FROM touched GROUP BY node_id, class) AS c;
    UPDATE reservations
       SET state = p_state, ended_at = v_at, outcome = p_outcome, version = version + 1
     WHERE id = p_id;
    IF v_held THEN
        DELETE FROM device_bookings WHERE reservation_id = p_id;
    END IF;
    RETURN v_deltas;
END
$$;
