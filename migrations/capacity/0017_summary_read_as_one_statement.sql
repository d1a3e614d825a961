-- The summary's placement read (the request without a selector) as one statement again, now that the schedulable
-- check sits inside the per-node probe: the plan walks `node_free` in its index order (best fit first), probes each
-- node's atoms and stops at the first `p_limit` that hold the request, as 0013's loop does, without a statement
-- started per node. Its plan is made once per session for any values (a plan made for one call's values, which
-- the planner thought would return two rows, hashed every node of the pool; a generic one has no such estimate),
-- and a read of ten nodes went from 0.25-0.30 ms to 0.13-0.19 ms in `psql`.
CREATE OR REPLACE FUNCTION summary_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
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
    RETURN QUERY
        SELECT f.node_id, c.free
        FROM node_free AS f
        CROSS JOIN LATERAL (
            SELECT array_agg(d.id ORDER BY d.id) AS free FROM devices AS d
            WHERE d.node_id = f.node_id AND d.pool_id = p_pool AND d.class = p_class AND d.bookable
              AND (d.booked_until IS NULL OR d.booked_until <= v_start)
              AND EXISTS (SELECT 1 FROM nodes AS n WHERE n.id = f.node_id AND n.pool_id = p_pool AND n.schedulable)
        ) AS c
        WHERE f.pool_id = p_pool AND f.class = p_class AND f.free >= p_per_node AND cardinality(c.free) >= p_per_node
        ORDER BY f.free, f.node_id
        LIMIT p_limit;
END
$$;
