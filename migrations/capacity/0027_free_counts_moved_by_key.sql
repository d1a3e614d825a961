-- The hints' writer after each commit (`adjust_free`) moved the free counts with one statement that joined the
-- summed changes to `node_free`. Its plan is kept for every call, and for an array of unknown length the planner
-- chose a hash join over the whole table: every call read all of `node_free` (2,128 rows in the benchmark, 0.3 ms)
-- to move the one or two rows a commit touched. The counts are now moved a row at a time, each an update by key, in
-- (node, class) order as before, so the rows are still locked in the order the walk over the hints corrects them in.
--
-- The refit it ends with ran inside an exception block of its own, nested in adjust_free's: a second
-- subtransaction on every call, for errors adjust_free's block already catches. The refit's body is now
-- `node_fit_rewrite`; `refit_nodes`, called on its own after a node's devices change, keeps its block around it.
--
-- Measured with pgbench on the benchmark's cluster, one client calling adjust_free for one node: 0.43 ms a call
-- before, 0.19 ms after.

CREATE FUNCTION node_fit_rewrite(p_nodes text[]) RETURNS void
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
END
$$;

CREATE OR REPLACE FUNCTION refit_nodes(p_nodes text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM node_fit_rewrite(p_nodes);
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'refit_nodes: % (%)', SQLERRM, SQLSTATE;
END
$$;

CREATE OR REPLACE FUNCTION adjust_free(p_deltas jsonb) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    r record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR r IN
        SELECT e ->> 0 AS node_id, e ->> 1 AS class, sum((e ->> 2)::int) AS delta
        FROM jsonb_array_elements(p_deltas) AS e
        GROUP BY 1, 2
        HAVING sum((e ->> 2)::int) <> 0
        ORDER BY 1, 2
    LOOP
        UPDATE node_free AS f SET free = greatest(0, least(f.atoms, f.free + r.delta))
        WHERE f.node_id = r.node_id AND f.class = r.class;
    END LOOP;
    PERFORM node_fit_rewrite(ARRAY(SELECT e ->> 0 FROM jsonb_array_elements(p_deltas) AS e));
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'adjust_free: % (%)', SQLERRM, SQLSTATE;
END
$$;
