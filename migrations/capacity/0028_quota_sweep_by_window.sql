-- The quota sweep (`tenant_peak`) counted a holder's bookings one row per atom: a reservation of eight GPUs put
-- eight identical windows into the sort behind the running sum. The bookings are now grouped by their window
-- (clipped to the one asked about) before the sweep, each group counting its atoms, so the sort and the running sum
-- follow the holder's distinct windows rather than its atoms. The index read is the same. At fleet size (`bench
-- fleet`'s busiest tenant, 2,339 atoms in 1,079 reservations over an hour a week ahead) a warm call went from
-- 1.27-1.65 ms to 1.03-1.21 ms in `psql`.
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
                   count(*) AS atoms
            FROM device_bookings AS b
            WHERE b.tenant_id = p_tenant AND b.pool_id = p_pool AND b.resource = p_resource AND b.live
              AND lower(b.during) >= v_start - v_longest AND lower(b.during) < v_end
              AND upper(b.during) > v_start
            GROUP BY 1, 2
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
