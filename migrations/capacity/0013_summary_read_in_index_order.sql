-- The summary's placement read walks `node_free` in its index order (best fit first) and stops at the first
-- `p_limit` nodes whose atoms hold the request, as it was meant to. As one statement the planner, estimating two
-- rows, joined every node of the pool with a hash and sorted them (in a pool of 64 nodes: 64 nodes' devices read,
-- 1 ms to plan and 1 ms to run, the largest part of a reserve). Here a loop reads the nodes in index order and each
-- node's atoms with one index probe; the statements' plans are kept for the session, so nothing is planned per
-- call. A request with a selector (model, product, attributes) may pass over many nodes whose atoms do not match,
-- so it keeps the one-statement read, planned for its values.
CREATE OR REPLACE FUNCTION summary_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
AS $$
DECLARE
    v_node text;
    v_free text[];
    v_found bigint := 0;
    v_start timestamptz := ms_ts(p_start_ms);
BEGIN
    IF p_limit <= 0 THEN
        RETURN;
    END IF;
    IF p_model IS NOT NULL OR p_product IS NOT NULL OR p_attributes <> '{}'::jsonb THEN
        RETURN QUERY EXECUTE
            'SELECT f.node_id, c.free
             FROM node_free AS f
             JOIN nodes AS n ON n.id = f.node_id
             CROSS JOIN LATERAL (
                 SELECT array_agg(d.id ORDER BY d.id) AS free FROM devices AS d
                 WHERE d.node_id = f.node_id AND d.pool_id = $1 AND d.class = $2 AND d.bookable
                   AND (d.booked_until IS NULL OR d.booked_until <= $6)
                   AND ($3::text IS NULL OR d.gpu_model = $3)
                   AND ($4::text IS NULL OR d.gpu_product = $4)
                   AND ($5::jsonb = ''{}''::jsonb OR d.attributes @> $5)
             ) AS c
             WHERE f.pool_id = $1 AND f.class = $2 AND f.free >= $7 AND n.pool_id = $1 AND n.schedulable
               AND cardinality(c.free) >= $7
             ORDER BY f.free, f.node_id
             LIMIT $8'
            USING p_pool, p_class, p_model, p_product, p_attributes, v_start, p_per_node, p_limit;
        RETURN;
    END IF;
    FOR v_node IN
        SELECT f.node_id FROM node_free AS f
        WHERE f.pool_id = p_pool AND f.class = p_class AND f.free >= p_per_node
        ORDER BY f.free, f.node_id
    LOOP
        SELECT array_agg(d.id ORDER BY d.id) INTO v_free
        FROM devices AS d
        WHERE d.node_id = v_node AND d.pool_id = p_pool AND d.class = p_class AND d.bookable
          AND (d.booked_until IS NULL OR d.booked_until <= v_start)
          AND EXISTS (SELECT 1 FROM nodes AS n WHERE n.id = v_node AND n.pool_id = p_pool AND n.schedulable);
        IF v_free IS NOT NULL AND cardinality(v_free) >= p_per_node THEN
            node_id := v_node;
            free := v_free;
            RETURN NEXT;
            v_found := v_found + 1;
            EXIT WHEN v_found >= p_limit;
        END IF;
    END LOOP;
END
$$;

-- A cancel's or release's facts: its statement (the reservation's nodes by key, through `= ANY`) was planned again
-- on every call, 0.23 ms of planning to run for 0.46 ms under `bench reserve --statements`. One plan suits every
-- call, as for the functions of capacity/0008.
ALTER FUNCTION reservation_facts(text) SET plan_cache_mode = force_generic_plan;
