-- Heartbeats in batches: the heartbeats that arrive while others are being written renew their sessions together,
-- in one call and one commit (`agent_heartbeats_json`), instead of one transaction each.
--
-- `p_items` is a JSON array of objects, one per heartbeat, in the caller's order:
--   {"n": node id or null, "h": credential hash or null, "c": certified node or null, "s": session id,
--    "k": the agent's clock in ms, "l": the lease in seconds}
-- (by node id, or by a confirmed credential's hash, exactly as `agent_heartbeat_json`). The answer is a JSON array
-- as long as `p_items`: element i is what `agent_heartbeat_json` would have answered for item i, NULL when the
-- session is not current or the credential unknown.
--
-- The sessions are locked in node order before any is written, so two batches never wait on each other in a
-- circle; a session named twice in one batch is renewed once, by its last heartbeat (both are counted, and both items get
-- its answer).
-- The generic plans this function keeps would read whole tables if hash or merge joins were allowed (they are
-- estimated from 100 rows of `unnest`, against tables of thousands of nodes): every join here is a probe of a
-- primary key, and the answers are matched to the items through a JSON object keyed by node and session. The plans
-- are generic from the first call: custom plans (the arrays written into each statement) cost more to make than
-- the batch costs to write, and PostgreSQL kept choosing them.
CREATE FUNCTION agent_heartbeats_json(p_items jsonb)
RETURNS jsonb
LANGUAGE plpgsql
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_ords bigint[];
    v_nodes text[];
    v_sessions text[];
    v_clocks bigint[];
    v_leases double precision[];
    v_beats jsonb;
BEGIN
    SELECT array_agg(i.ord ORDER BY i.ord),
           array_agg(coalesce(i.n, (SELECT c.node_id FROM node_credentials AS c
                                    WHERE c.secret_sha256 = i.h AND c.confirmed
                                      AND (i.c IS NULL OR c.node_id = i.c))) ORDER BY i.ord),
           array_agg(i.s ORDER BY i.ord), array_agg(i.k ORDER BY i.ord), array_agg(i.l ORDER BY i.ord)
      INTO v_ords, v_nodes, v_sessions, v_clocks, v_leases
      FROM ROWS FROM (jsonb_to_recordset(p_items) AS (n text, h text, c text, s text, k bigint, l double precision))
           WITH ORDINALITY AS i(n, h, c, s, k, l, ord);
    IF v_ords IS NULL THEN
        RETURN '[]'::jsonb;
    END IF;

    PERFORM 1 FROM agent_sessions AS a
     WHERE a.node_id = ANY (v_nodes)
     ORDER BY a.node_id
       FOR UPDATE OF a;

    WITH wanted AS (
        SELECT DISTINCT ON (x.node, x.session) x.node, x.session, x.clock_ms, x.lease_secs,
               count(*) OVER (PARTITION BY x.node, x.session) AS beats
          FROM unnest(v_ords, v_nodes, v_sessions, v_clocks, v_leases) AS x(ord, node, session, clock_ms, lease_secs)
         WHERE x.node IS NOT NULL
         ORDER BY x.node, x.session, x.ord DESC),
    renewed AS (
        UPDATE agent_sessions AS a
           SET heartbeat_at = compute_now(),
               expires_at = compute_now() + make_interval(secs => w.lease_secs),
               heartbeats = a.heartbeats + w.beats,
               clock_skew_ms = w.clock_ms - ts_ms(compute_db_clock())
          FROM wanted AS w
         WHERE a.node_id = w.node AND a.session_id = w.session
        RETURNING a.node_id, a.session_id, a.clock_skew_ms, ts_ms(a.expires_at) AS expires_ms)
    SELECT jsonb_object_agg(r.node_id || '/' || r.session_id, b.beat)
      INTO v_beats
      FROM renewed AS r,
           LATERAL (
               SELECT jsonb_build_object(
                          'node_id', r.node_id, 'pool_id', n.pool_id, 'tenant_id', p.owner_tenant_id,
                          'expires_ms', r.expires_ms, 'clock_skew_ms', r.clock_skew_ms,
                          'connectivity', n.connectivity, 'generation', n.generation,
                          'observed_generation', n.observed_generation, 'spec', n.spec::text,
                          'skew_raised', n.conditions @> '[{"type": "ClockSkew"}]'::jsonb,
                          'waiting', EXISTS (SELECT 1 FROM node_commands AS q
                                             WHERE q.node_id = n.id AND q.state = 'queued'
                                               AND q.not_before <= compute_now())) AS beat
                 FROM nodes AS n JOIN pools AS p ON p.id = n.pool_id
                WHERE n.id = r.node_id) AS b;

    -- Each item's answer by key, in the items' order (a key that is missing, or NULL, answers NULL).
    RETURN (SELECT jsonb_agg(coalesce(v_beats, '{}'::jsonb) -> (x.node || '/' || x.session) ORDER BY x.ord)
              FROM unnest(v_ords, v_nodes, v_sessions) AS x(ord, node, session));
END
$$;
