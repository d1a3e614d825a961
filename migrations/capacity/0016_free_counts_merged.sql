-- The free-capacity hints are now moved by one writer per process (the pool's follow-ups), which sends the changes
-- of every commit queued since its last write in one call: the same node and class may come more than once, and
-- another process's writer may move some of the same rows at once. So the changes are summed by node and class,
-- and the rows locked in (node, class) order before they are moved, the order the walk over the hints corrects
-- them in; each node's fit is then recounted once, in node order, as before.
CREATE OR REPLACE FUNCTION adjust_free(p_deltas jsonb) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH changes AS (
        SELECT e ->> 0 AS node_id, e ->> 1 AS class, sum((e ->> 2)::int) AS delta
        FROM jsonb_array_elements(p_deltas) AS e
        GROUP BY 1, 2
    ), locked AS (
        SELECT f.node_id, f.class, c.delta
        FROM node_free AS f
        JOIN changes AS c ON c.node_id = f.node_id AND c.class = f.class
        WHERE c.delta <> 0
        ORDER BY f.node_id, f.class
        FOR UPDATE OF f
    )
    UPDATE node_free AS f SET free = greatest(0, least(f.atoms, f.free + l.delta))
    FROM locked AS l
    WHERE f.node_id = l.node_id AND f.class = l.class;
    PERFORM refit_nodes(ARRAY(SELECT e ->> 0 FROM jsonb_array_elements(p_deltas) AS e));
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'adjust_free: % (%)', SQLERRM, SQLSTATE;
END
$$;
