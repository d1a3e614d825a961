-- Quota claims: one tenant's reservations in one pool no longer queue on its quota row.
--
-- Before this, every quota-limited reserve updated the tenant's `quota_usage` row inside its repeatable-read
-- transaction, so two reserves of one tenant in one pool could not overlap: the second waited for the row and was
-- then refused (40001), since its snapshot predated the first's commit. Now a reserve first claims its window and
-- count in a short transaction of its own, committed in the same message right before its command transaction
-- begins (`Db::begin_after`), and the command's quota check counts every claim it can see beside the bookings.
--
-- Why that is safe: order the claims by their commits. A claim commits before its command's snapshot is taken, so
-- each command sees every claim committed before its own, or, once such a command finished, its bookings (a
-- command drops its claim in the transaction that writes its bookings, so one of the two is always visible). The
-- last command to claim therefore counts everything admitted before it, and by induction no instant exceeds the
-- quota. A claim may be swept by another (after a minute) or replaced by a retry; a command that relied on its
-- claim deletes it at commit at repeatable read, so it is refused (40001) if the claim changed after its
-- snapshot, and falls back to the quota row if the claim was gone before it.
--
-- The paths that still lock the quota row (a pending reservation placed by the worker, an extension, a reserve
-- whose claim does not cover its window) stay ordered with the claims: a claim updates the same row at read
-- committed, so it waits for such a command to commit (and then sees its bookings), and such a command that finds
-- a claim committed since its snapshot is refused (40001) and tries again.

CREATE TABLE quota_claims (
    reservation_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    pool_id text NOT NULL,
    resource text NOT NULL,
    count bigint NOT NULL CHECK (count > 0),
    start_ms bigint NOT NULL,
    end_ms bigint NOT NULL CHECK (end_ms > start_ms),
    -- The server's real clock (a simulated business clock may jump): claims older than a minute are swept.
    claimed_at timestamptz NOT NULL
);
CREATE INDEX quota_claims_holder ON quota_claims (tenant_id, pool_id, resource);

-- The tenant's peak over [start, end) from its live bookings and its claims, leaving out the claim of
-- `p_exclude` (the caller's own): a sweep, where one ending at an instant does not overlap one starting at it.
CREATE FUNCTION tenant_peak(p_tenant text, p_pool text, p_resource text, p_start_ms bigint, p_end_ms bigint,
                            p_exclude text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (
        WITH held AS (
            SELECT greatest(lower(b.during), ms_ts(p_start_ms)) AS from_at,
                   least(upper(b.during), ms_ts(p_end_ms)) AS to_at, 1::int8 AS atoms
            FROM device_bookings AS b
            WHERE b.tenant_id = p_tenant AND b.pool_id = p_pool AND b.resource = p_resource AND b.live
              AND upper(b.during) > ms_ts(p_start_ms) AND lower(b.during) < ms_ts(p_end_ms)
            UNION ALL
            SELECT ms_ts(greatest(c.start_ms, p_start_ms)), ms_ts(least(c.end_ms, p_end_ms)), c.count
            FROM quota_claims AS c
            WHERE c.tenant_id = p_tenant AND c.pool_id = p_pool AND c.resource = p_resource
              AND c.reservation_id IS DISTINCT FROM p_exclude
              AND c.end_ms > p_start_ms AND c.start_ms < p_end_ms
        ), steps AS (
            SELECT from_at AS at, atoms AS delta FROM held
            UNION ALL
            SELECT to_at AS at, -atoms AS delta FROM held
        )
        SELECT coalesce(max(running), 0)::int8 FROM (
            SELECT sum(delta) OVER (ORDER BY at, delta ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
            FROM steps
        ) AS sweep);
END
$$;

-- Every claim counts for the commands that have none of their own (the worker's placements, extensions).
CREATE OR REPLACE FUNCTION tenant_peak(p_tenant text, p_pool text, p_resource text, p_start_ms bigint,
                                       p_end_ms bigint)
RETURNS bigint
LANGUAGE sql
AS $$ SELECT tenant_peak(p_tenant, p_pool, p_resource, p_start_ms, p_end_ms, NULL) $$;

-- Claims a new reservation's quota in a transaction of its own (`store::claim_quota_call`), before its command
-- transaction: true when it claimed, false when there is nothing to claim (the tenant owns the pool, the
-- reservation exists, it will not place now, or its window is not one a placement can have). The window is the
-- one `reserve_facts` computes, a second longer when it starts at placement (the second may turn in between).
-- The commit need not wait for the disk: the command's own commit flushes it, and a claim lost in a crash claimed
-- for a command that never committed.
CREATE FUNCTION claim_quota(p_id text, p_tenant text, p_pool text, p_resource text, p_count bigint,
                            p_start_ms bigint, p_duration_ms bigint, p_place boolean)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_now bigint;
    v_start bigint;
BEGIN
    IF NOT p_place OR p_count < 1 OR p_duration_ms IS NULL OR p_duration_ms < 1
       OR NOT EXISTS (SELECT 1 FROM pools WHERE id = p_pool AND owner_tenant_id <> p_tenant)
       OR EXISTS (SELECT 1 FROM events WHERE stream_id = p_id) THEN
        RETURN false;
    END IF;
    v_now := compute_now_ms();
    v_start := coalesce(p_start_ms, ((v_now + 999) / 1000) * 1000);
    IF v_start < v_now - 1000 OR p_duration_ms > 366::bigint * 24 * 3600 * 1000 THEN
        RETURN false;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    -- At read committed this waits for a command holding the row and never refuses.
    PERFORM lock_quota(p_tenant, p_pool, p_resource);
    DELETE FROM quota_claims
    WHERE tenant_id = p_tenant AND pool_id = p_pool AND resource = p_resource
      AND claimed_at < compute_db_clock() - interval '1 minute';
    INSERT INTO quota_claims (reservation_id, tenant_id, pool_id, resource, count, start_ms, end_ms, claimed_at)
    VALUES (p_id, p_tenant, p_pool, p_resource, p_count, v_start,
            v_start + p_duration_ms + CASE WHEN p_start_ms IS NULL THEN 1000 ELSE 0 END, compute_db_clock())
    ON CONFLICT (reservation_id) DO UPDATE
    SET tenant_id = excluded.tenant_id, pool_id = excluded.pool_id, resource = excluded.resource,
        count = excluded.count, start_ms = excluded.start_ms, end_ms = excluded.end_ms,
        claimed_at = excluded.claimed_at;
    RETURN true;
END
$$;

-- Drops a reservation's claim (`store::drop_quota_claim_call`): in its command's transaction, with the bookings it
-- made, or on its own after the command failed.
CREATE FUNCTION drop_quota_claim(p_id text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM quota_claims WHERE reservation_id = p_id;
END
$$;

-- reserve_facts as before, with the claim: a reserve whose claim covers its window and count does not lock the
-- quota row, and every reserve leaves its own claim out of the tenant's peak and says whether it saw one
-- ('claimed': the command then drops it).
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
            (SELECT jsonb_agg(jsonb_build_object('node_id', c.node_id, 'free', to_jsonb(c.free)))
             FROM exact_candidates(p_pool, p_class, p_model, p_product, p_attributes, v_start, v_end, p_per_node,
                                   p_exact_limit) AS c),
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