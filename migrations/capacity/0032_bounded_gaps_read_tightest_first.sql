-- The gaps' sample read the bounded gaps (those between two bookings) through their GiST index, which hands back
-- the gaps that contain the window in no useful order. Two costs followed, found at fleet size (`bench fleet`'s
-- 1,000-node pool, where every atom is booked somewhere in the next 30 days, so every window a week ahead is read
-- from the bounded gaps):
--
-- * The atoms of one node came back scattered. A node whose eight GPUs share one eight-GPU booking has eight gaps
--   of the same bounds, yet a sample of 512 atoms could hold none to five whole nodes: too few for a request of 8
--   GPUs (or 4), which then read every free atom of the pool over the window (1,100 to 4,800 of them, 8 to 15 ms).
-- * Planned afresh for each call (`force_custom_plan`), the sample read every gap that contains the window through
--   a bitmap before it kept 512 (2.6 to 3.3 ms under `EXPLAIN ANALYZE` for a week-ahead hour), and planning the
--   statement took 1.5 ms more.
--
-- The bounded gaps are now also in a btree by where they end, then where they start: the gaps that contain
-- [start, end) are those ending at or after its end that start at or before its start, checked on the index entry.
-- Read in that order, the tightest fits in time come first (as the first gaps already do), and the gaps a shared
-- booking left on a node's atoms come one after another. That read stops at its limit when the gaps containing the
-- window are many near its end, but walks every later gap of the pool when they are few (4 to 7 ms at fleet size),
-- and the GiST read is cheap exactly then. So `gap_candidates` samples in rounds:
--   0. the tightest fits among the gaps that end within a day of the window's end, kept only when they name a
--      quarter of the limit (a short answer here says nothing: the day's bound may have cut it);
--   1. when round 0 read fewer atoms than it asked for (the day's bound stopped it, so the gaps that fit may be
--      few), the GiST read, twice the sample: its answer stands when it names a quarter of the limit, or when it
--      read fewer atoms than it asked for (then it saw every one);
--   2. and 3. the tightest fits without the day's bound, twice and four times the sample, under the same rule;
--   4. every free atom, through the same statement without a limit (it was a statement of its own).
-- That statement keeps one generic plan: the rounds' limits and the selector are parameters, and nothing in the plan
-- depends on their values. A selector's probe of each atom's device is made only for the atoms of nodes the sample
-- holds enough atoms of: a round of 1,024 atoms named about 40 such nodes, so the rest were probed for nothing.
--
-- In `psql` on the kept fleet, 84 windows of an hour a week ahead, two passes before and after, in ms (avg, max):
-- 8 GPUs 4.3 to 4.7 and 11 to 11.7, now 2.1 to 2.3 and 6.3 to 7.4; naming `H100`, 6.1 to 6.3 and 20, now 2.2 to 2.3
-- and 6.5 to 6.7. 4 GPUs 5.9 to 6.0 and 12.5 to 13, now 1.0 to 1.1 and 2.9 to 3.4; naming `H100`, 11.5 and 28, now
-- 1.5 to 1.9 and 3.9 to 6.4. 1 GPU 1.0 to 1.1, now 0.5; naming `H100`, 1.4 to 1.5, now 0.8 to 1.0.
CREATE INDEX atom_gaps_bounded_by_end
    ON atom_gaps (pool_id, class, upper(gap), lower(gap), node_id, device_id)
    WHERE NOT lower_inf(gap) AND NOT upper_inf(gap);

-- `free_atoms_over`, with the bounded gaps read in the order of their end (the tightest fits first, a shared
-- booking's atoms together), and only those ending by `p_until` when it is given.
CREATE FUNCTION free_atoms_tightest(p_pool text, p_class text, p_start timestamptz, p_end timestamptz,
                                    p_limit bigint, p_until timestamptz)
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
       AND upper(g.gap) >= p_end AND upper(g.gap) <= coalesce(p_until, 'infinity'::timestamptz)
       AND lower(g.gap) <= p_start
     ORDER BY upper(g.gap), lower(g.gap), g.node_id, g.device_id
     LIMIT p_limit)
$$;

CREATE OR REPLACE FUNCTION gap_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_start timestamptz := ms_ts(p_start_ms);
    v_end timestamptz := ms_ts(p_end_ms);
    v_sample bigint := p_limit * greatest(p_per_node, 1);
    v_any boolean := p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb;
    v_round integer;
    v_size bigint;
    v_sampled jsonb;
    v_fullest bigint;
BEGIN
    -- The rounds described at the top of this file; round 4 reads every free atom (no limit) and always answers.
    FOR v_round IN 0..4 LOOP
        -- Round 0 read as many atoms as it asked for in some part: the gaps that fit are many, round 1 is skipped.
        CONTINUE WHEN v_round = 1 AND v_fullest >= v_size;
        v_size := CASE v_round WHEN 0 THEN v_sample WHEN 3 THEN v_sample * 4 WHEN 4 THEN NULL ELSE v_sample * 2 END;
        WITH s AS MATERIALIZED (
            SELECT a.node_id, a.device_id, a.part
            FROM free_atoms_tightest(p_pool, p_class, v_start, v_end, v_size,
                                     CASE WHEN v_round = 0 THEN v_end + interval '1 day' END) AS a
            WHERE v_round IN (0, 2, 3)
            UNION ALL
            SELECT a.node_id, a.device_id, a.part
            FROM free_atoms_over(p_pool, p_class, v_start, v_end, v_size) AS a
            WHERE v_round IN (1, 4)
        ), f AS (
            -- A selector's probe is made only for the atoms of nodes the sample holds enough atoms of.
            SELECT s.node_id, s.device_id FROM s
            WHERE v_any
               OR (s.node_id IN (SELECT h.node_id FROM s AS h GROUP BY h.node_id HAVING count(*) >= p_per_node)
                   AND EXISTS (SELECT 1 FROM devices AS d
                               WHERE d.id = s.device_id
                                 AND (p_model IS NULL OR d.gpu_model = p_model)
                                 AND (p_product IS NULL OR d.gpu_product = p_product)
                                 AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
                               OFFSET 0))
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
        IF v_round = 4 OR coalesce(jsonb_array_length(v_sampled), 0) >= greatest(1, p_limit / 4)
           OR (v_fullest < v_size AND v_round > 0) THEN
            RETURN QUERY
            SELECT e.value ->> 0, ARRAY(SELECT jsonb_array_elements_text(e.value -> 1))
            FROM jsonb_array_elements(coalesce(v_sampled, '[]'::jsonb)) WITH ORDINALITY AS e(value, ord)
            ORDER BY e.ord;
            RETURN;
        END IF;
    END LOOP;
END
$$;
