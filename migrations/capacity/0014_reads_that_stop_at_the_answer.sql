-- Placement's two remaining reads that grew with a pool's calendar rather than with the request, found at fleet
-- size (`bench fleet`: a thousand nodes whose every atom is booked somewhere in the next 30 days, so the summary
-- of atoms with nothing booked ahead is empty and every placement asks the exact question):
--
-- * The quota sweep read a holder's live bookings by their end: every booking that ends after the window's start,
--   so for a window starting now all of the tenant's calendar ahead (21,576 bookings for the busiest tenant of the
--   busy pool, 7 ms), to keep the 1,300 that overlap. A booking that overlaps [start, end) begins before the end and
--   no earlier than the start less the holder's longest live booking; with the bookings indexed by their start (the
--   range itself in the index, so nothing is read from the heap) and that longest duration one probe of a second
--   index, the read is bounded by the window plus the holder's longest booking instead of by the calendar. The
--   bookings that hold the whole window add a constant; only the others are sorted into the sweep.
--
-- * The free atoms over a window came from one GiST index over every gap of every atom. Each atom's first gap
--   (nothing booked before it) and last gap (nothing booked after it) reach to infinity, so the index's pages
--   mixed them with the bounded gaps and a containment search pruned little: 300 to 400 pages for a one-hour
--   window in the busy pool. The gaps are now indexed in three parts, each row in one of them: the first gaps by
--   where they end (a window fits when the gap ends at or after the window's end: a range read of a btree, in the
--   order of the tightest fit in time first), the last gaps by where they start (fits when it starts at or
--   before the window's start), and the bounded gaps in a GiST index of their own, whose pages now hold only
--   bounded ranges. A sample that read fewer atoms than it asked for has seen every free atom, so it is the full
--   answer and the full read is not made again.

CREATE INDEX device_bookings_holder_starts
    ON device_bookings (tenant_id, pool_id, resource, lower(during)) INCLUDE (during) WHERE live;
CREATE INDEX device_bookings_holder_longest
    ON device_bookings (tenant_id, pool_id, resource, (upper(during) - lower(during))) WHERE live;
DROP INDEX device_bookings_holder_window;

CREATE OR REPLACE FUNCTION tenant_peak(p_tenant text, p_pool text, p_resource text, p_start_ms bigint,
                                       p_end_ms bigint, p_exclude text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_start timestamptz := ms_ts(p_start_ms);
    v_end timestamptz := ms_ts(p_end_ms);
    v_longest interval;
BEGIN
    SELECT max(upper(b.during) - lower(b.during)) INTO v_longest
    FROM device_bookings AS b
    WHERE b.tenant_id = p_tenant AND b.pool_id = p_pool AND b.resource = p_resource AND b.live;
    RETURN (
        WITH held AS MATERIALIZED (
            SELECT greatest(lower(b.during), v_start) AS from_at, least(upper(b.during), v_end) AS to_at,
                   1::int8 AS atoms
            FROM device_bookings AS b
            WHERE b.tenant_id = p_tenant AND b.pool_id = p_pool AND b.resource = p_resource AND b.live
              AND lower(b.during) >= v_start - v_longest AND lower(b.during) < v_end
              AND upper(b.during) > v_start
            UNION ALL
            SELECT ms_ts(greatest(c.start_ms, p_start_ms)), ms_ts(least(c.end_ms, p_end_ms)), c.count
            FROM quota_claims AS c
            WHERE c.tenant_id = p_tenant AND c.pool_id = p_pool AND c.resource = p_resource
              AND c.reservation_id IS DISTINCT FROM p_exclude
              AND c.end_ms > p_start_ms AND c.start_ms < p_end_ms
        ), partial AS (
            SELECT from_at, to_at, atoms FROM held WHERE from_at > v_start OR to_at < v_end
        ), steps AS (
            SELECT from_at AS at, atoms AS delta FROM partial
            UNION ALL
            SELECT to_at AS at, -atoms AS delta FROM partial
        )
        SELECT (coalesce((SELECT sum(h.atoms) FROM held AS h WHERE h.from_at <= v_start AND h.to_at >= v_end), 0)
                + coalesce(max(running), 0))::int8
        FROM (
            SELECT sum(delta) OVER (ORDER BY at, delta ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
            FROM steps
        ) AS sweep);
END
$$;

CREATE INDEX atom_gaps_first
    ON atom_gaps (pool_id, class, (coalesce(upper(gap), 'infinity'::timestamptz)), node_id, device_id)
    WHERE lower_inf(gap);
CREATE INDEX atom_gaps_last
    ON atom_gaps (pool_id, class, lower(gap) DESC, node_id, device_id)
    WHERE upper_inf(gap) AND NOT lower_inf(gap);
CREATE INDEX atom_gaps_bounded
    ON atom_gaps USING gist (pool_id, class, gap)
    WHERE NOT lower_inf(gap) AND NOT upper_inf(gap);
DROP INDEX atom_gaps_free;

-- The atoms of a pool's class free over the whole of [start, end), each read from the part of the gaps that can
-- hold it: at most `p_limit` from each part (NULL: all), each row with its part. The first gaps come tightest fit
-- first, the last gaps latest start first, so the atoms a node has free together lie side by side. One statement,
-- inlined into the caller's.
CREATE FUNCTION free_atoms_over(p_pool text, p_class text, p_start timestamptz, p_end timestamptz, p_limit bigint)
RETURNS TABLE (node_id text, device_id text, part integer)
LANGUAGE sql
STABLE
AS $$
    (SELECT g.node_id, g.device_id, 1 FROM atom_gaps AS g
     WHERE g.pool_id = p_pool AND g.class = p_class AND lower_inf(g.gap)
       AND coalesce(upper(g.gap), 'infinity'::timestamptz) >= p_end
     ORDER BY coalesce(upper(g.gap), 'infinity'::timestamptz), g.node_id, g.device_id
     LIMIT p_limit)
    UNION ALL
    (SELECT g.node_id, g.device_id, 2 FROM atom_gaps AS g
     WHERE g.pool_id = p_pool AND g.class = p_class AND upper_inf(g.gap) AND NOT lower_inf(g.gap)
       AND lower(g.gap) <= p_start
     ORDER BY lower(g.gap) DESC, g.node_id, g.device_id
     LIMIT p_limit)
    UNION ALL
    (SELECT g.node_id, g.device_id, 3 FROM atom_gaps AS g
     WHERE g.pool_id = p_pool AND g.class = p_class AND NOT lower_inf(g.gap) AND NOT upper_inf(g.gap)
       AND g.gap @> tstzrange(p_start, p_end)
     LIMIT p_limit)
$$;

-- As in capacity/0007, reading the free atoms through `free_atoms_over`: a request without a selector first reads
-- at most `p_limit` × `p_per_node` of each part; when that finds a quarter of `p_limit` fitting nodes, or no part
-- gave as many atoms as it asked for (then it saw them all), it is the answer. Otherwise, and with a selector, every
-- free atom of the pool over the window is read.
CREATE OR REPLACE FUNCTION exact_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_start timestamptz := ms_ts(p_start_ms);
    v_end timestamptz := ms_ts(p_end_ms);
    v_sample bigint := p_limit * greatest(p_per_node, 1);
    v_sampled jsonb;
    v_fullest bigint;
BEGIN
    IF p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb THEN
        WITH f AS MATERIALIZED (
            SELECT a.node_id, a.device_id, a.part
            FROM free_atoms_over(p_pool, p_class, v_start, v_end, v_sample) AS a
        )
        SELECT (SELECT jsonb_agg(jsonb_build_array(c.node_id, c.free) ORDER BY c.n, c.node_id)
                FROM (
                    SELECT f.node_id, array_agg(f.device_id ORDER BY f.device_id) AS free, count(*) AS n
                    FROM f JOIN nodes AS n ON n.id = f.node_id
                    WHERE n.pool_id = p_pool AND n.schedulable
                    GROUP BY f.node_id
                    HAVING count(*) >= p_per_node
                    ORDER BY count(*), f.node_id
                    LIMIT p_limit
                ) AS c),
               (SELECT coalesce(max(p.n), 0) FROM (SELECT count(*) AS n FROM f GROUP BY f.part) AS p)
        INTO v_sampled, v_fullest;
        IF coalesce(jsonb_array_length(v_sampled), 0) >= greatest(1, p_limit / 4) OR v_fullest < v_sample THEN
            RETURN QUERY
            SELECT e.value ->> 0, ARRAY(SELECT jsonb_array_elements_text(e.value -> 1))
            FROM jsonb_array_elements(coalesce(v_sampled, '[]'::jsonb)) WITH ORDINALITY AS e(value, ord)
            ORDER BY e.ord;
            RETURN;
        END IF;
    END IF;
    -- Every free atom of the pool over the window (too few fit among the first read, or a selector). Without a
    -- selector its test is planned away.
    RETURN QUERY
    SELECT g.node_id, array_agg(g.device_id ORDER BY g.device_id)
    FROM free_atoms_over(p_pool, p_class, v_start, v_end, NULL) AS g JOIN nodes AS n ON n.id = g.node_id
    WHERE n.pool_id = p_pool AND n.schedulable
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
