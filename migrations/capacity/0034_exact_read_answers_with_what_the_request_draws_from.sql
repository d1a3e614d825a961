-- Two costs of the exact placement read (`exact_candidates`: the hint `node_fit`, then the rounds of the gaps'
-- sample in `gap_candidates`), found at fleet size (`bench fleet`'s 1,000-node pool, every atom booked somewhere in
-- the next 30 days), in the reserve of 8 GPUs a week ahead:
--
-- * An answer stood only when it named a quarter of the read's limit: 16 nodes for any request of fewer than 17. A
--   reserve draws from its best `nodes + spread` candidates (spread 0 on its first try, more on each try after a
--   lost race), and asks the free-capacity summary for twice that and four more (`summary_limit` in the command
--   layer). For a quarter of the week-ahead hours, round 0's 512 tightest gaps named 6 to 15 whole free nodes, and
--   each of those calls went on to a round of 1,024 gaps. The extra nodes were no better: placement ranks nodes by
--   their free atoms, then by a hash of the reservation's id.
-- * The answer changed shape four times on its way out. `gap_candidates` built a `jsonb` array, expanded it into
--   rows (a subquery per node for its atoms), `exact_candidates` passed the rows on, and `reserve_facts` built
--   `jsonb` again. Grouping the sample by node also sorted each node's atoms apart: an aggregate with its own ORDER
--   BY sorts every group on its own in PostgreSQL 15.
--
-- Now both reads take `p_enough`, the number of nodes that settles an answer, capped by the quarter of the limit.
-- `reserve_facts` passes the count it asks of the summary, and so does the command layer's own exact read; the
-- scalar placement's first read passes the quarter, which it relies on to tell whether it saw every fitting node.
-- The nine-argument `exact_candidates` is dropped: every caller now says what settles its answer. The reads answer
-- `jsonb` in the shape `reserve_facts` returns (`exact_candidates_json`, `gap_candidates_json`), with the sample
-- sorted once before it is grouped; the rows of `exact_candidates` are made from that answer for the command layer's
-- reads.

CREATE FUNCTION gap_candidates_json(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint, p_enough bigint)
RETURNS jsonb
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_start timestamptz := ms_ts(p_start_ms);
    v_end timestamptz := ms_ts(p_end_ms);
    v_sample bigint := p_limit * greatest(p_per_node, 1);
    v_any boolean := p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb;
    v_want bigint := greatest(1, least(p_limit / 4, p_enough));
    v_round integer;
    v_size bigint;
    v_sampled jsonb;
    v_fullest bigint;
BEGIN
    -- The rounds of capacity/0032; round 4 reads every free atom (no limit) and always answers.
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
        SELECT (SELECT jsonb_agg(jsonb_build_object('node_id', c.node_id, 'free', c.free) ORDER BY c.n, c.node_id)
                FROM (
                    -- Sorted once here, not per node inside array_agg (an ordered aggregate sorts each group apart).
                    SELECT f.node_id, array_agg(f.device_id) AS free, count(*) AS n
                    FROM (SELECT f.node_id, f.device_id FROM f ORDER BY f.node_id, f.device_id) AS f
                    GROUP BY f.node_id
                    HAVING count(*) >= p_per_node
                       AND EXISTS (SELECT 1 FROM nodes AS n
                                   WHERE n.id = f.node_id AND n.pool_id = p_pool AND n.schedulable OFFSET 0)
                    ORDER BY count(*), f.node_id
                    LIMIT p_limit
                ) AS c),
               (SELECT coalesce(max(p.n), 0) FROM (SELECT count(*) AS n FROM s GROUP BY s.part) AS p)
        INTO v_sampled, v_fullest;
        IF v_round = 4 OR coalesce(jsonb_array_length(v_sampled), 0) >= v_want
           OR (v_fullest < v_size AND v_round > 0) THEN
            RETURN coalesce(v_sampled, '[]'::jsonb);
        END IF;
    END LOOP;
END
$$;

DROP FUNCTION gap_candidates(text, text, text, text, jsonb, bigint, bigint, integer, bigint);

CREATE FUNCTION exact_candidates_json(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint, p_enough bigint)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_want bigint := greatest(1, least(p_limit / 4, p_enough));
    v_fitting jsonb;
BEGIN
    IF p_model IS NULL AND p_product IS NULL AND p_attributes = '{}'::jsonb THEN
        SELECT jsonb_agg(jsonb_build_object('node_id', c.node_id, 'free', c.free) ORDER BY c.ord) INTO v_fitting
        FROM fit_candidates(p_pool, p_class, ms_ts(p_end_ms), p_per_node, v_want)
             WITH ORDINALITY AS c(node_id, free, ord);
    ELSE
        SELECT jsonb_agg(jsonb_build_object('node_id', c.node_id, 'free', c.free) ORDER BY c.ord) INTO v_fitting
        FROM fit_candidates_matching(p_pool, p_class, p_model, p_product, p_attributes, ms_ts(p_end_ms), p_per_node,
                                     v_want, v_want * 4) WITH ORDINALITY AS c(node_id, free, ord);
    END IF;
    IF coalesce(jsonb_array_length(v_fitting), 0) >= v_want THEN
        RETURN v_fitting;
    END IF;
    RETURN gap_candidates_json(p_pool, p_class, p_model, p_product, p_attributes, p_start_ms, p_end_ms, p_per_node,
                               p_limit, p_enough);
END
$$;

-- The rows of `exact_candidates_json`, in its order, for the command layer's own reads.
CREATE FUNCTION exact_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint, p_enough bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE sql
AS $$
    SELECT e.value ->> 'node_id', ARRAY(SELECT jsonb_array_elements_text(e.value -> 'free'))
    FROM jsonb_array_elements(exact_candidates_json(p_pool, p_class, p_model, p_product, p_attributes, p_start_ms,
                                                    p_end_ms, p_per_node, p_limit, p_enough))
         WITH ORDINALITY AS e(value, ord)
    ORDER BY e.ord
$$;

DROP FUNCTION exact_candidates(text, text, text, text, jsonb, bigint, bigint, integer, bigint);

-- As in capacity/0006, with the count that settles the exact read passed to it.
CREATE OR REPLACE FUNCTION reserve_facts(
    p_id text, p_tenant text, p_pool text, p_project text, p_resource text, p_class text, p_model text,
    p_product text, p_attributes jsonb, p_start_ms bigint, p_duration_ms bigint, p_per_node integer,
    p_nodes integer, p_summary_limit bigint, p_exact_limit bigint, p_place boolean)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_now bigint := compute_now_ms();
    v_events jsonb := stream_json(p_id);
    v_most_ahead constant bigint := 366::bigint * 24 * 3600 * 1000;
    v_pool record;
    v_limited boolean;
    v_out jsonb;
    v_start bigint;
    v_end bigint;
    v_candidates jsonb;
    v_exact boolean := false;
    v_claim record;
    v_claimed boolean := false;
BEGIN
    SELECT tenant_id, pool_id, resource, count, start_ms, end_ms INTO v_claim FROM quota_claims
    WHERE reservation_id = p_id;
    v_claimed := FOUND;
    IF jsonb_array_length(v_events) > 0 THEN
        RETURN jsonb_build_object('now_ms', v_now, 'events', v_events, 'authz', pool_authz(p_pool),
                                  'claimed', v_claimed);
    END IF;
    SELECT owner_tenant_id, gpu_model, sharing, policy INTO v_pool FROM pools WHERE id = p_pool;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('now_ms', v_now, 'events', v_events, 'claimed', v_claimed);
    END IF;
    v_limited := v_pool.owner_tenant_id <> p_tenant;
    v_out := jsonb_build_object(
        'now_ms', v_now,
        'events', v_events,
        'authz', pool_authz(p_pool),
        'pool', jsonb_build_object('owner_tenant_id', v_pool.owner_tenant_id, 'gpu_model', v_pool.gpu_model,
                                   'sharing', v_pool.sharing, 'policy', v_pool.policy),
        'offers', CASE WHEN v_limited THEN coalesce(
            (SELECT jsonb_agg(jsonb_build_object('tenant_id', o.tenant_id, 'quota', o.quota, 'priority', o.priority,
                                                 'include_descendants', o.include_descendants,
                                                 'at_ms', ts_ms(o.updated_at))
                              ORDER BY o.tenant_id)
             FROM pool_offers AS o WHERE o.pool_id = p_pool), '[]'::jsonb) ELSE '[]'::jsonb END,
        'project_in_tenant', p_project IS NULL
            OR EXISTS (SELECT 1 FROM projects WHERE id = p_project AND tenant_id = p_tenant),
        'claimed', v_claimed);
    v_start := coalesce(p_start_ms, ((v_now + 999) / 1000) * 1000);
    IF NOT p_place OR p_duration_ms IS NULL OR p_duration_ms < 1 OR p_duration_ms > v_most_ahead
       OR v_start < v_now - 1000 OR v_start > v_now + v_most_ahead THEN
        RETURN v_out;
    END IF;
    v_end := v_start + p_duration_ms;
    IF v_limited THEN
        -- Without a claim of its own that covers this window and count, the check serializes on the quota row.
        IF NOT (v_claimed AND v_claim.tenant_id = p_tenant AND v_claim.pool_id = p_pool
                AND v_claim.resource = p_resource AND v_claim.start_ms <= v_start AND v_claim.end_ms >= v_end
                AND v_claim.count >= p_per_node::bigint * p_nodes) THEN
            PERFORM lock_quota(p_tenant, p_pool, p_resource);
        END IF;
    END IF;
    PERFORM 1 FROM pools WHERE id = p_pool FOR SHARE;
    v_candidates := coalesce(
        (SELECT jsonb_agg(jsonb_build_object('node_id', c.node_id, 'free', to_jsonb(c.free)))
         FROM summary_candidates(p_pool, p_class, p_model, p_product, p_attributes, v_start, p_per_node,
                                 p_summary_limit) AS c),
        '[]'::jsonb);
    IF jsonb_array_length(v_candidates) < p_nodes THEN
        v_exact := true;
        v_candidates := coalesce(
            exact_candidates_json(p_pool, p_class, p_model, p_product, p_attributes, v_start, v_end, p_per_node,
                                  p_exact_limit, p_summary_limit),
            '[]'::jsonb);
    END IF;
    v_out := v_out || jsonb_build_object('start_ms', v_start, 'end_ms', v_end, 'exact', v_exact,
                                         'candidates', v_candidates);
    IF v_limited THEN
        v_out := v_out || jsonb_build_object('peak', tenant_peak(p_tenant, p_pool, p_resource, v_start, v_end,
                                                                   CASE WHEN v_claimed THEN p_id END));
    END IF;
    IF jsonb_array_length(v_candidates) < p_nodes THEN
        v_out := v_out || jsonb_build_object(
            'holders', pool_holders(p_pool, p_class, p_model, p_product, p_attributes, p_per_node),
            'pending', (SELECT count(*) FROM reservations WHERE pool_id = p_pool AND state = 'pending'));
    END IF;
    RETURN v_out;
END
$$;