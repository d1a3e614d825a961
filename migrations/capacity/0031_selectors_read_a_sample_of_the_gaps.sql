-- A request with a selector (a GPU model, a product or attributes) is read the way one without a selector is: the
-- hint `node_fit` first (`fit_candidates_matching`), then the bounded sample of the gaps (`gap_candidates`), each
-- keeping only the atoms whose device matches. Until now a selector skipped both and read every free atom of the
-- pool over the window, then looked up each one's device: in a pool of 1,000 nodes a week ahead, 60 to 200 ms for
-- a request naming the pool's own GPU model, against 3 ms for the same request without it. The sample's
-- completeness is judged before the selector filters it, so a sample that was cut short and holds too few matching
-- nodes still falls back to the full read. Both reads look up each free atom's device by its key (OFFSET 0 keeps the
-- planner from a semi-join): as a hash join the planner read the whole devices table, or all of the pool's 8,000
-- rows, to build the hash, 15 to 30 ms, where the full read's 1,275 free atoms of a week-ahead window cost 4 ms of
-- probes.
CREATE OR REPLACE FUNCTION gap_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
DECLARE
    v_start timestamptz := ms_ts(p_start_ms);
    v_end timestamptz := ms_ts(p_end_ms);
    v_sample bigint := p_limit * greatest(p_per_node, 1);
    v_any boolean := p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb;
    v_sampled jsonb;
    v_fullest bigint;
BEGIN
    WITH s AS MATERIALIZED (
        SELECT a.node_id, a.device_id, a.part
        FROM free_atoms_over(p_pool, p_class, v_start, v_end, v_sample) AS a
    ), f AS (
        SELECT s.node_id, s.device_id FROM s
        WHERE v_any
           OR EXISTS (SELECT 1 FROM devices AS d
                      WHERE d.id = s.device_id
                        AND (p_model IS NULL OR d.gpu_model = p_model)
                        AND (p_product IS NULL OR d.gpu_product = p_product)
                        AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
                      OFFSET 0)
    )
    SELECT (SELECT jsonb_agg(jsonb_build_array(c.node_id, c.free) ORDER BY c.n, c.node_id)
            FROM (
                SELECT f.node_id, array_agg(f.device_id ORDER BY f.device_id) AS free, count(*) AS n
                FROM f
                GROUP BY f.node_id
                HAVING count(*) >= p_per_node
                   AND EXISTS (SELECT 1 FROM nodes AS n
                               WHERE n.id = f.node_id AND n.pool_id = p_pool AND n.schedulable OFFSET 0)
                ORDER BY count(*), f.node_id
                LIMIT p_limit
            ) AS c),
           (SELECT coalesce(max(p.n), 0) FROM (SELECT count(*) AS n FROM s GROUP BY s.part) AS p)
    INTO v_sampled, v_fullest;
    IF coalesce(jsonb_array_length(v_sampled), 0) >= greatest(1, p_limit / 4) OR v_fullest < v_sample THEN
        RETURN QUERY
        SELECT e.value ->> 0, ARRAY(SELECT jsonb_array_elements_text(e.value -> 1))
        FROM jsonb_array_elements(coalesce(v_sampled, '[]'::jsonb)) WITH ORDINALITY AS e(value, ord)
        ORDER BY e.ord;
        RETURN;
    END IF;
    -- Every free atom of the pool over the window: too few fit among the sample, which was cut short.
    RETURN QUERY
    SELECT g.node_id, array_agg(g.device_id ORDER BY g.device_id)
    FROM free_atoms_over(p_pool, p_class, v_start, v_end, NULL) AS g
    WHERE v_any
       OR EXISTS (SELECT 1 FROM devices AS d
                  WHERE d.id = g.device_id
                    AND (p_model IS NULL OR d.gpu_model = p_model)
                    AND (p_product IS NULL OR d.gpu_product = p_product)
                    AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
                  OFFSET 0)
    GROUP BY g.node_id
    HAVING count(*) >= p_per_node
       AND EXISTS (SELECT 1 FROM nodes AS n WHERE n.id = g.node_id AND n.pool_id = p_pool AND n.schedulable OFFSET 0)
    ORDER BY count(*), g.node_id
    LIMIT p_limit;
END
$$;

-- The hint's nodes for a request with a selector: `fit_candidates` with each node's atoms kept only when their device
-- matches, walking at most `p_scan` of the hint's nodes (a selector may pass over most of them; the gaps' sample
-- answers then).
CREATE FUNCTION fit_candidates_matching(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_end timestamptz,
    p_per_node integer, p_want bigint, p_scan bigint)
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
        LIMIT p_scan
    LOOP
        SELECT array_agg(g.device_id ORDER BY g.device_id) INTO v_free
        FROM atom_gaps AS g
        JOIN devices AS d ON d.id = g.device_id
        WHERE g.node_id = v_node AND g.class = p_class AND lower_inf(g.gap) AND g.pool_id = p_pool
          AND coalesce(upper(g.gap), 'infinity'::timestamptz) >= p_end
          AND (p_model IS NULL OR d.gpu_model = p_model)
          AND (p_product IS NULL OR d.gpu_product = p_product)
          AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
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

-- The exact read asks the hint first with a selector too, as it does without one (capacity/0015).
CREATE OR REPLACE FUNCTION exact_candidates(
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
    ELSE
        SELECT jsonb_agg(jsonb_build_array(c.node_id, c.free)) INTO v_fitting
        FROM fit_candidates_matching(p_pool, p_class, p_model, p_product, p_attributes, ms_ts(p_end_ms), p_per_node,
                                     v_want, v_want * 4) AS c;
    END IF;
    IF coalesce(jsonb_array_length(v_fitting), 0) >= v_want THEN
        RETURN QUERY
        SELECT e.value ->> 0, ARRAY(SELECT jsonb_array_elements_text(e.value -> 1))
        FROM jsonb_array_elements(v_fitting) WITH ORDINALITY AS e(value, ord)
        ORDER BY e.ord;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT g.node_id, g.free
    FROM gap_candidates(p_pool, p_class, p_model, p_product, p_attributes, p_start_ms, p_end_ms, p_per_node, p_limit)
         AS g;
END
$$;
