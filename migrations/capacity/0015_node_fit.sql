-- A second free-capacity hint, for calendars booked ahead: how long each node can hold k atoms from now on.
--
-- `node_free` counts the atoms with nothing booked ahead, so in a pool whose every atom is booked somewhere in the
-- next month (advance reservations laid end to end) it offers nothing, and every placement read the free atoms of
-- the whole pool over the window and grouped them by node: at fleet size, 3,500 atoms and 9 to 12 ms for a request
-- of 8 GPUs on one node, most of a reserve.
--
-- An atom's first gap (capacity/0007) is the time before its first live booking: it holds any window that ends by
-- then, wherever the window starts. `node_fit` keeps, for each node, atom class and k from 1 to the node's bookable
-- atoms of that class, the k-th latest end of those atoms' first gaps (`infinity` for an atom with nothing booked,
-- `-infinity` for one with no first gap): a node can hold k atoms over a window that ends by `until`. Read in
-- index order for the request's k from the window's end on, it names the nodes to look at tightest fit first;
-- each is then checked against the atoms' gaps in the command's own snapshot, and the read stops at the first
-- fitting ones.
--
-- Like `node_free` it is a hint, written right after the commit of each change of bookings (`adjust_free`, which
-- now receives every node a change touched; `refit_nodes` after `summarize_nodes` when a node's devices change or
-- a replacement moves bookings; `rebuild_node_fit` after a bulk load), at read committed, so it never makes a
-- command conflict; a stale row only changes which nodes are looked at first, and when the hint finds too few the
-- exact read of capacity/0014 follows as before. A node's rows are rewritten under an advisory lock on the node,
-- so a recount computed before another commit never lands after that commit's own recount.

CREATE TABLE node_fit (
    node_id text NOT NULL,
    class text NOT NULL,
    k integer NOT NULL,
    pool_id text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (node_id, class, k)
);
CREATE INDEX node_fit_order ON node_fit (pool_id, class, k, until, node_id);
ALTER TABLE node_fit SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                          autovacuum_vacuum_cost_delay = 0);
-- A node's first gaps, and one atom's.
CREATE INDEX atom_gaps_first_of_node ON atom_gaps (node_id, class, device_id) WHERE lower_inf(gap);

-- What the hint's rows of the given nodes should be, from their atoms' first gaps (each one probe of the index
-- below: as a join, a plan kept for every call read the whole table of gaps).
CREATE FUNCTION node_fit_of(p_nodes text[])
RETURNS TABLE (node_id text, class text, k integer, pool_id text, until timestamptz)
LANGUAGE sql
STABLE
AS $$
    SELECT a.node_id, a.class,
           (row_number() OVER (PARTITION BY a.node_id, a.class ORDER BY a.until DESC))::integer, a.pool_id, a.until
    FROM (
        SELECT d.node_id, d.class, d.pool_id,
               coalesce((SELECT coalesce(upper(g.gap), 'infinity'::timestamptz) FROM atom_gaps AS g
                         WHERE g.node_id = d.node_id AND g.class = d.class AND g.device_id = d.id
                           AND lower_inf(g.gap)),
                        '-infinity'::timestamptz) AS until
        FROM devices AS d
        WHERE d.node_id = ANY(p_nodes) AND d.bookable
    ) AS a
$$;

-- Rewrites the hint's rows of the given nodes: reads what they should be once, removes the rows that differ, then
-- adds what is missing (statements that each reach the nodes' rows by key, so that one plan suits every call; as
-- one statement that compared and updated, its plan either was made again on every call or, kept, read the whole
-- table). Runs right after a COMMIT, so it never fails its caller: a recount lost to an error is made by the
-- node's next change.
CREATE FUNCTION refit_nodes(p_nodes text[]) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_nodes text[] := ARRAY(SELECT DISTINCT u.id FROM unnest(p_nodes) AS u(id) WHERE u.id IS NOT NULL ORDER BY u.id);
    v_want node_fit[];
BEGIN
    IF cardinality(v_nodes) = 0 THEN
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('node_fit'), hashtext(u.id)) FROM unnest(v_nodes) AS u(id);
    -- A statement of its own, so that its snapshot sees every commit whose recount ran before this lock.
    SELECT array_agg(ROW(w.node_id, w.class, w.k, w.pool_id, w.until)::node_fit ORDER BY w.node_id, w.class, w.k)
      INTO v_want
    FROM node_fit_of(v_nodes) AS w;
    DELETE FROM node_fit AS f
    WHERE f.node_id = ANY(v_nodes)
      AND NOT EXISTS (SELECT 1 FROM unnest(v_want) AS w
                      WHERE w.node_id = f.node_id AND w.class = f.class AND w.k = f.k AND w.pool_id = f.pool_id
                        AND w.until = f.until);
    INSERT INTO node_fit (node_id, class, k, pool_id, until)
    SELECT w.node_id, w.class, w.k, w.pool_id, w.until FROM unnest(v_want) AS w
    ON CONFLICT (node_id, class, k) DO NOTHING;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'refit_nodes: % (%)', SQLERRM, SQLSTATE;
END
$$;

-- The whole hint again (after a bulk load, and here for what is already there).
CREATE FUNCTION rebuild_node_fit() RETURNS void
LANGUAGE sql
AS $$
    DELETE FROM node_fit;
    INSERT INTO node_fit (node_id, class, k, pool_id, until)
    SELECT * FROM node_fit_of(ARRAY(SELECT DISTINCT node_id FROM devices WHERE bookable));
$$;

SELECT rebuild_node_fit();

-- The booking functions report every node whose atoms they touched, a change of zero included, so that the call
-- after the commit refits them: booking an atom ahead changes its first gap, not whether anything is booked.
CREATE OR REPLACE FUNCTION touch_for_booking(p_devices text[], p_until_ms bigint) RETURNS jsonb
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
    FROM (SELECT node_id, class, sum(delta)::int AS delta FROM touched GROUP BY node_id, class) AS c;
    RETURN v_deltas;
END
$$;

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
    END IF;
    RETURN v_deltas;
END
$$;

-- Replacing touch_for_booking drops the setting capacity/0008 gave it: again.
ALTER FUNCTION touch_for_booking(text[], bigint) SET plan_cache_mode = force_generic_plan;

-- Moves the free counts by the changes that are not zero, then refits every node the change touched.
CREATE OR REPLACE FUNCTION adjust_free(p_deltas jsonb) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE node_free AS f SET free = greatest(0, least(f.atoms, f.free + u.delta))
    FROM (SELECT e ->> 0 AS node_id, e ->> 1 AS class, (e ->> 2)::int AS delta
          FROM jsonb_array_elements(p_deltas) AS e) AS u
    WHERE f.node_id = u.node_id AND f.class = u.class AND u.delta <> 0;
    PERFORM refit_nodes(ARRAY(SELECT e ->> 0 FROM jsonb_array_elements(p_deltas) AS e));
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'adjust_free: % (%)', SQLERRM, SQLSTATE;
END
$$;

-- The nodes the hint names for `p_per_node` atoms over a window ending at `p_end`, tightest fit first, each
-- checked against its atoms' first gaps in this snapshot (and the node schedulable): at most `p_want` fitting
-- nodes with the atoms whose first gap holds the window.
CREATE FUNCTION fit_candidates(p_pool text, p_class text, p_end timestamptz, p_per_node integer, p_want bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
AS $$
DECLARE
    v_node text;
    v_free text[];
    v_found bigint := 0;
BEGIN
    IF p_want <= 0 OR p_per_node < 1 THEN
        RETURN;
    END IF;
    FOR v_node IN
        SELECT f.node_id FROM node_fit AS f
        WHERE f.pool_id = p_pool AND f.class = p_class AND f.k = p_per_node AND f.until >= p_end
        ORDER BY f.until, f.node_id
    LOOP
        SELECT array_agg(g.device_id ORDER BY g.device_id) INTO v_free
        FROM atom_gaps AS g
        WHERE g.node_id = v_node AND g.class = p_class AND lower_inf(g.gap) AND g.pool_id = p_pool
          AND coalesce(upper(g.gap), 'infinity'::timestamptz) >= p_end
          AND EXISTS (SELECT 1 FROM nodes AS n WHERE n.id = v_node AND n.pool_id = p_pool AND n.schedulable);
        IF v_free IS NOT NULL AND cardinality(v_free) >= p_per_node THEN
            node_id := v_node;
            free := v_free;
            RETURN NEXT;
            v_found := v_found + 1;
            EXIT WHEN v_found >= p_want;
        END IF;
    END LOOP;
END
$$;

-- The exact read asks the hint first: when it names a quarter of `p_limit` fitting nodes, they are the answer;
-- otherwise the read of capacity/0014, kept under the name `gap_candidates`, follows.
ALTER FUNCTION exact_candidates(text, text, text, text, jsonb, bigint, bigint, integer, bigint)
    RENAME TO gap_candidates;

CREATE FUNCTION exact_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
AS $$
DECLARE
    v_want bigint := greatest(1, p_limit / 4);
    v_fitting jsonb;
BEGIN
    IF p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb THEN
        SELECT jsonb_agg(jsonb_build_array(c.node_id, c.free)) INTO v_fitting
        FROM fit_candidates(p_pool, p_class, ms_ts(p_end_ms), p_per_node, v_want) AS c;
        IF coalesce(jsonb_array_length(v_fitting), 0) >= v_want THEN
            RETURN QUERY
            SELECT e.value ->> 0, ARRAY(SELECT jsonb_array_elements_text(e.value -> 1))
            FROM jsonb_array_elements(v_fitting) WITH ORDINALITY AS e(value, ord)
            ORDER BY e.ord;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    SELECT g.node_id, g.free
    FROM gap_candidates(p_pool, p_class, p_model, p_product, p_attributes, p_start_ms, p_end_ms, p_per_node, p_limit)
         AS g;
END
$$;
