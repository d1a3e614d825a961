-- What a reservation command decides on, read by one server-side call at the start of its transaction
-- (`Db::begin_with`): the commands' reads of `commands/src/store`, each one function here, and the two facts calls
-- that gather them. Rust decides; these only read and take the locks a decision needs, in the lock order
-- quota_usage, pools, nodes, devices, device_bookings.

-- Business time in epoch milliseconds, as `clock::compute_now_ms` reads it.
CREATE FUNCTION compute_now_ms() RETURNS bigint
LANGUAGE sql
AS $$ SELECT floor(extract(epoch FROM compute_now()) * 1000)::int8 $$;

-- Nodes of the pool whose atoms hold one node's share of a request from `p_start_ms` on, read from the
-- free-capacity summary best fit first and stopping at the first `p_limit`: an atom is free when none of its live
-- bookings reaches past the start (`store::summary_candidates`). Planned for each call's values: a generic plan
-- does not know that the limit is small, and may read every node's atoms before it sorts.
CREATE FUNCTION summary_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT f.node_id, c.free
    FROM node_free AS f
    JOIN nodes AS n ON n.id = f.node_id
    CROSS JOIN LATERAL (
        SELECT array_agg(d.id ORDER BY d.id) AS free FROM devices AS d
        WHERE d.node_id = f.node_id AND d.pool_id = p_pool AND d.class = p_class AND d.bookable
          AND (d.booked_until IS NULL OR d.booked_until <= ms_ts(p_start_ms))
          AND (p_model IS NULL OR d.gpu_model = p_model)
          AND (p_product IS NULL OR d.gpu_product = p_product)
          AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
    ) AS c
    WHERE f.pool_id = p_pool AND f.class = p_class AND f.free >= p_per_node AND n.pool_id = p_pool AND n.schedulable
      AND cardinality(c.free) >= p_per_node
    ORDER BY f.free, f.node_id
    LIMIT p_limit;
END
$$;

-- Schedulable nodes of the pool with one node's share of matching atoms free over the whole window, checked
-- against every live booking of the pool over it, best fit first, at most `p_limit` (`store::candidates`). The
-- pool's bookings over the window are read first through the (pool_id, upper(during)) index and kept aside, so the
-- devices are checked against them in one hash anti-join. Planned for each call's values: a generic plan cannot
-- tell a pool of four nodes from one of a thousand.
CREATE FUNCTION exact_candidates(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_start_ms bigint,
    p_end_ms bigint, p_per_node integer, p_limit bigint)
RETURNS TABLE (node_id text, free text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    RETURN QUERY
    WITH busy AS MATERIALIZED (
        SELECT b.device_id FROM device_bookings AS b
        WHERE b.pool_id = p_pool AND b.live AND upper(b.during) > ms_ts(p_start_ms)
          AND lower(b.during) < ms_ts(p_end_ms)
    )
    SELECT d.node_id, array_agg(d.id ORDER BY d.id)
    FROM devices AS d JOIN nodes AS n ON n.id = d.node_id
    WHERE d.pool_id = p_pool AND n.pool_id = p_pool AND d.bookable AND d.class = p_class AND n.schedulable
      AND (p_model IS NULL OR d.gpu_model = p_model)
      AND (p_product IS NULL OR d.gpu_product = p_product)
      AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
      AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.device_id = d.id)
    GROUP BY d.node_id
    HAVING count(*) >= p_per_node
    ORDER BY count(*), d.node_id
    LIMIT p_limit;
END
$$;

-- How many nodes of the pool (schedulable or not) have enough matching atoms to ever hold one node's share.
CREATE FUNCTION pool_holders(
    p_pool text, p_class text, p_model text, p_product text, p_attributes jsonb, p_per_node integer)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (
        SELECT count(*) FROM (
            SELECT d.node_id FROM devices AS d
            WHERE d.pool_id = p_pool AND d.bookable AND d.class = p_class
              AND (p_model IS NULL OR d.gpu_model = p_model)
              AND (p_product IS NULL OR d.gpu_product = p_product)
              AND (p_attributes = '{}'::jsonb OR d.attributes @> p_attributes)
            GROUP BY d.node_id
            HAVING count(*) >= p_per_node
        ) AS holders);
END
$$;

-- The most atoms of a resource the tenant holds in the pool at any instant of [start, end): a sweep over its live
-- bookings, where one ending at an instant does not overlap one starting at it (`store::peak_usage`).
CREATE FUNCTION tenant_peak(p_tenant text, p_pool text, p_resource text, p_start_ms bigint, p_end_ms bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (
        WITH held AS (
            SELECT greatest(lower(b.during), ms_ts(p_start_ms)) AS from_at,
                   least(upper(b.during), ms_ts(p_end_ms)) AS to_at
            FROM device_bookings AS b
            WHERE b.tenant_id = p_tenant AND b.pool_id = p_pool AND b.resource = p_resource AND b.live
              AND upper(b.during) > ms_ts(p_start_ms) AND lower(b.during) < ms_ts(p_end_ms)
        ), steps AS (
            SELECT from_at AS at, 1 AS delta FROM held
            UNION ALL
            SELECT to_at AS at, -1 AS delta FROM held
        )
        SELECT coalesce(max(running), 0)::int8 FROM (
            SELECT sum(delta) OVER (ORDER BY at, delta ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
            FROM steps
        ) AS sweep);
END
$$;

-- The tenant's quota row for (pool, resource), created if needed and updated: first in the lock order, it serializes
-- one tenant's quota checks in one pool; an update, so that at repeatable read a check that committed since this
-- snapshot refuses it (40001) (`store::lock_quota`).
CREATE FUNCTION lock_quota(p_tenant text, p_pool text, p_resource text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO quota_usage (tenant_id, pool_id, resource, checks) VALUES (p_tenant, p_pool, p_resource, 1)
    ON CONFLICT (tenant_id, pool_id, resource) DO UPDATE SET checks = quota_usage.checks + 1;
END
$$;

-- Re-reads a placement's chosen nodes FOR SHARE and locks its chosen atoms FOR UPDATE (skipping those other
-- transactions hold, when asked), in the lock order: {"schedulable": chosen nodes still schedulable, "locked":
-- the atoms now locked} (`store::lock_chosen`).
CREATE FUNCTION lock_chosen(p_nodes text[], p_atoms text[], p_skip_held boolean) RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_schedulable bigint;
    v_locked text[];
BEGIN
    SELECT count(*) INTO v_schedulable
    FROM (SELECT 1 FROM nodes WHERE id = ANY(p_nodes) AND schedulable ORDER BY id FOR SHARE) AS n;
    IF p_skip_held THEN
        v_locked := ARRAY(SELECT id FROM devices WHERE id = ANY(p_atoms) ORDER BY id FOR UPDATE SKIP LOCKED);
    ELSE
        v_locked := ARRAY(SELECT id FROM devices WHERE id = ANY(p_atoms) ORDER BY id FOR UPDATE);
    END IF;
    RETURN jsonb_build_object('schedulable', v_schedulable, 'locked', to_jsonb(v_locked));
END
$$;

-- What the authorizer decides a pool's methods on (`auth::resolve`): the pool, its site's region, and its offers'
-- tenants with whether each covers descendants. NULL when there is no such pool.
CREATE FUNCTION pool_authz(p_pool text) RETURNS jsonb
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (
        SELECT jsonb_build_object(
            'pool_id', p.id, 'pool_owner', p.owner_tenant_id, 'pool_class', p.class, 'pool_gpu_model', p.gpu_model,
            'pool_sharing', p.sharing, 'pool_region', s.iam_region,
            'offer_tenants', to_jsonb(ARRAY(SELECT o.tenant_id FROM pool_offers AS o WHERE o.pool_id = p.id
                                            ORDER BY o.tenant_id)),
            'offer_descendants', to_jsonb(ARRAY(SELECT o.include_descendants FROM pool_offers AS o
                                                WHERE o.pool_id = p.id ORDER BY o.tenant_id)))
        FROM pools AS p JOIN sites AS s ON s.id = p.site_id
        WHERE p.id = p_pool);
END
$$;

-- What the authorizer decides a recorded reservation's methods on: its tenant, size, project and length, under its
-- pool's facts. NULL when there is no such reservation.
CREATE FUNCTION reservation_authz(p_id text) RETURNS jsonb
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (
        SELECT jsonb_build_object('tenant_id', r.tenant_id, 'count', r.count, 'project_id', r.project_id,
                                  'duration_s', (r.request ->> 'durationS')::float8) || pool_authz(r.pool_id)
        FROM reservations AS r
        WHERE r.id = p_id);
END
$$;

-- What a command on a reservation decides on: business time now, the reservation's events, and which nodes of its
-- allocations run an agent (a binding and a release wait for those) and which are draining (a drain completes once
-- its node holds nothing).
CREATE FUNCTION reservation_facts(p_id text) RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_nodes text[] := ARRAY(SELECT node_id FROM allocations WHERE reservation_id = p_id ORDER BY node_id);
BEGIN
    RETURN jsonb_build_object(
        'now_ms', compute_now_ms(),
        'events', stream_json(p_id),
        'agents', to_jsonb(ARRAY(SELECT DISTINCT node_id FROM node_credentials
                                 WHERE node_id = ANY(v_nodes) ORDER BY node_id)),
        'draining', to_jsonb(ARRAY(SELECT id FROM nodes WHERE id = ANY(v_nodes) AND draining ORDER BY id)),
        'authz', reservation_authz(p_id));
END
$$;

-- What a reserve decides on: business time now, what the authorizer decides on, and the reservation's events (a
-- retry finds them and needs nothing more); else the pool, its offers (unless the tenant owns it) and whether the
-- project is the tenant's. When it may place now (`p_place`) and its window is sane (the decision refuses the rest
-- with a clear answer): the quota row locked (unless the tenant owns the pool), the pool locked in share mode, the
-- window, the candidates (from the summary; from the exact query when the summary has fewer than `p_nodes`), the
-- tenant's peak over the window; and, when even the exact query has too few, how many nodes could ever hold it and
-- how many reservations wait.
CREATE FUNCTION reserve_facts(
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
BEGIN
    IF jsonb_array_length(v_events) > 0 THEN
        RETURN jsonb_build_object('now_ms', v_now, 'events', v_events, 'authz', pool_authz(p_pool));
    END IF;
    SELECT owner_tenant_id, gpu_model, sharing, policy INTO v_pool FROM pools WHERE id = p_pool;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('now_ms', v_now, 'events', v_events);
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
            OR EXISTS (SELECT 1 FROM projects WHERE id = p_project AND tenant_id = p_tenant));
    v_start := coalesce(p_start_ms, ((v_now + 999) / 1000) * 1000);
    IF NOT p_place OR p_duration_ms IS NULL OR p_duration_ms < 1 OR p_duration_ms > v_most_ahead
       OR v_start < v_now - 1000 OR v_start > v_now + v_most_ahead THEN
        RETURN v_out;
    END IF;
    v_end := v_start + p_duration_ms;
    IF v_limited THEN
        PERFORM lock_quota(p_tenant, p_pool, p_resource);
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
            (SELECT jsonb_agg(jsonb_build_object('node_id', c.node_id, 'free', to_jsonb(c.free)))
             FROM exact_candidates(p_pool, p_class, p_model, p_product, p_attributes, v_start, v_end, p_per_node,
                                   p_exact_limit) AS c),
            '[]'::jsonb);
    END IF;
    v_out := v_out || jsonb_build_object('start_ms', v_start, 'end_ms', v_end, 'exact', v_exact,
                                         'candidates', v_candidates);
    IF v_limited THEN
        v_out := v_out || jsonb_build_object('peak', tenant_peak(p_tenant, p_pool, p_resource, v_start, v_end));
    END IF;
    IF jsonb_array_length(v_candidates) < p_nodes THEN
        v_out := v_out || jsonb_build_object(
            'holders', pool_holders(p_pool, p_class, p_model, p_product, p_attributes, p_per_node),
            'pending', (SELECT count(*) FROM reservations WHERE pool_id = p_pool AND state = 'pending'));
    END IF;
    RETURN v_out;
END
$$;
