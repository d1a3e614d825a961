-- A statement that books or frees several atoms edits their gaps in two statements instead of a few per atom.
--
-- 0012's trigger walked the changed bookings one at a time: for a new booking, delete the gap that holds it and
-- insert what is left either side; for a removed one, look up its atom, delete the gaps that end where it started
-- and start where it ended, and insert their union. An 8-GPU reserve ran that loop eight times and its cancel ran
-- it eight times again, 48 statements in all. Measured with pgbench on eight atoms of a small pool, inserting the
-- eight bookings and deleting them again took 1.29 to 1.78 ms (median 1.61) with the loop and 1.23 to 1.62 ms
-- (median 1.31) with the statements below; the same pair with the trigger doing nothing took 0.67 ms.
--
-- Now, once the trigger has counted the statement's rows:
-- * more than 64 rows, or two edits of one atom in one statement (each edit would need the gaps the one before it
--   left), recompute those atoms' gaps from their bookings, as 0012 did for large statements;
-- * up to three edits keep 0012's loop, which is cheaper than the statements below for one or two atoms (a
--   1-GPU reserve and its cancel measured the same either way, 0.65 to 0.83 ms);
-- * more edit all their atoms at once. The gaps to change are found per atom through its index and locked in the
--   atoms' order (so two statements touching the same atoms queue instead of deadlocking), then deleted by row
--   address, and the new gaps are made from what was deleted: a gap another transaction removed meanwhile is not
--   deleted here, so its booking counts as not placed and its atom is recomputed, as before.
--
-- The torture test compares `atom_gaps` with `atom_gaps_from_bookings()` after every run.

CREATE OR REPLACE FUNCTION atom_gaps_after_booking_change() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    r record;
    v_gap record;
    v_atom record;
    v_before tstzrange;
    v_after tstzrange;
    v_rows bigint;
    v_edits bigint;
    v_atoms bigint;
    v_unplaced text[] := '{}';
BEGIN
    SELECT count(*),
           count(*) FILTER (WHERE c.live AND NOT isempty(c.during)),
           count(DISTINCT c.device_id) FILTER (WHERE c.live AND NOT isempty(c.during))
    INTO v_rows, v_edits, v_atoms
    FROM changed AS c;
    IF v_edits = 0 THEN
        RETURN NULL;
    END IF;
    IF v_rows > 64 OR v_atoms < v_edits THEN
        PERFORM refresh_atom_gaps(ARRAY(SELECT DISTINCT c.device_id FROM changed AS c ORDER BY 1));
        RETURN NULL;
    END IF;
    IF v_edits <= 3 THEN
        FOR r IN
            SELECT c.device_id, c.during FROM changed AS c
            WHERE c.live AND NOT isempty(c.during)
            ORDER BY c.device_id, lower(c.during)
        LOOP
            IF TG_OP = 'INSERT' THEN
                -- The one gap that holds the new booking gives way to what is left of it on either side.
                DELETE FROM atom_gaps AS g
                WHERE g.device_id = r.device_id AND g.gap @> r.during
                RETURNING g.node_id, g.pool_id, g.class, g.gap INTO v_gap;
                IF NOT FOUND THEN
                    v_unplaced := v_unplaced || r.device_id;
                    CONTINUE;
                END IF;
                INSERT INTO atom_gaps (device_id, node_id, pool_id, class, gap)
                SELECT r.device_id, v_gap.node_id, v_gap.pool_id, v_gap.class, left_over.gap
                FROM (VALUES (tstzrange(lower(v_gap.gap), lower(r.during))),
                             (tstzrange(upper(r.during), upper(v_gap.gap)))) AS left_over(gap)
                WHERE NOT isempty(left_over.gap);
            ELSE
                -- The removed booking's window and the gaps either side of it become one gap.
                SELECT d.node_id, d.pool_id, d.class INTO v_atom
                FROM devices AS d WHERE d.id = r.device_id AND d.bookable;
                CONTINUE WHEN NOT FOUND;
                DELETE FROM atom_gaps AS g
                WHERE g.device_id = r.device_id AND upper(g.gap) = lower(r.during)
                RETURNING g.gap INTO v_before;
                DELETE FROM atom_gaps AS g
                WHERE g.device_id = r.device_id AND lower(g.gap) = upper(r.during)
                RETURNING g.gap INTO v_after;
                INSERT INTO atom_gaps (device_id, node_id, pool_id, class, gap)
                VALUES (r.device_id, v_atom.node_id, v_atom.pool_id, v_atom.class,
                        tstzrange(CASE WHEN v_before IS NULL THEN lower(r.during) ELSE lower(v_before) END,
                                  CASE WHEN v_after IS NULL THEN upper(r.during) ELSE upper(v_after) END));
            END IF;
        END LOOP;
    ELSIF TG_OP = 'INSERT' THEN
        WITH found AS (
            SELECT x.device_id, x.during, g.gap_row
            FROM (SELECT c.device_id, c.during FROM changed AS c
                  WHERE c.live AND NOT isempty(c.during) ORDER BY c.device_id) AS x
            CROSS JOIN LATERAL (
                SELECT a.ctid AS gap_row FROM atom_gaps AS a
                WHERE a.device_id = x.device_id AND a.gap @> x.during
                FOR UPDATE
            ) AS g
        ), gone AS (
            DELETE FROM atom_gaps AS a WHERE a.ctid = ANY (ARRAY(SELECT f.gap_row FROM found AS f))
            RETURNING a.device_id, a.node_id, a.pool_id, a.class, a.gap
        ), left_over AS (
            INSERT INTO atom_gaps (device_id, node_id, pool_id, class, gap)
            SELECT g.device_id, g.node_id, g.pool_id, g.class, part.gap
            FROM gone AS g
            JOIN changed AS c ON c.device_id = g.device_id AND c.live AND NOT isempty(c.during)
            CROSS JOIN LATERAL (VALUES (tstzrange(lower(g.gap), lower(c.during))),
                                       (tstzrange(upper(c.during), upper(g.gap)))) AS part(gap)
            WHERE NOT isempty(part.gap)
        )
        SELECT array_agg(c.device_id ORDER BY c.device_id) INTO v_unplaced
        FROM changed AS c
        WHERE c.live AND NOT isempty(c.during) AND c.device_id NOT IN (SELECT g.device_id FROM gone AS g);
    ELSE
        WITH x AS (
            SELECT c.device_id, c.during, d.node_id, d.pool_id, d.class
            FROM (SELECT c.device_id, c.during FROM changed AS c
                  WHERE c.live AND NOT isempty(c.during) ORDER BY c.device_id) AS c
            CROSS JOIN LATERAL (
                SELECT v.node_id, v.pool_id, v.class FROM devices AS v WHERE v.id = c.device_id AND v.bookable
            ) AS d
        ), near AS (
            SELECT g.gap_row
            FROM x CROSS JOIN LATERAL (
                SELECT a.ctid AS gap_row FROM atom_gaps AS a
                WHERE a.device_id = x.device_id AND (upper(a.gap) = lower(x.during) OR lower(a.gap) = upper(x.during))
                FOR UPDATE
            ) AS g
        ), gone AS (
            DELETE FROM atom_gaps AS a WHERE a.ctid = ANY (ARRAY(SELECT n.gap_row FROM near AS n))
            RETURNING a.device_id, a.gap
        )
        INSERT INTO atom_gaps (device_id, node_id, pool_id, class, gap)
        SELECT x.device_id, x.node_id, x.pool_id, x.class,
               tstzrange(CASE WHEN b.gap IS NULL THEN lower(x.during) ELSE lower(b.gap) END,
                         CASE WHEN f.gap IS NULL THEN upper(x.during) ELSE upper(f.gap) END)
        FROM x
        LEFT JOIN gone AS b ON b.device_id = x.device_id AND upper(b.gap) = lower(x.during)
        LEFT JOIN gone AS f ON f.device_id = x.device_id AND lower(f.gap) = upper(x.during);
    END IF;
    IF cardinality(v_unplaced) > 0 THEN
        PERFORM refresh_atom_gaps(v_unplaced);
    END IF;
    RETURN NULL;
END
$$;
