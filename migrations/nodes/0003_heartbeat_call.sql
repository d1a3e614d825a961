-- A heartbeat in one round trip: `agent_heartbeat` by node id, or by a confirmed credential's hash (and the node a
-- client certificate names, when the connection must carry one), answered as one JSON object (NULL when the session
-- is not current, or the credential unknown), so that BEGIN, the call and COMMIT travel in one message.
CREATE FUNCTION agent_heartbeat_json(
    p_node_id text, p_credential_sha256 text, p_certified text, p_session_id text, p_lease_secs double precision,
    p_clock_ms bigint)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_node text := p_node_id;
BEGIN
    IF v_node IS NULL THEN
        SELECT c.node_id INTO v_node FROM node_credentials AS c
        WHERE c.secret_sha256 = p_credential_sha256 AND c.confirmed
          AND (p_certified IS NULL OR c.node_id = p_certified);
        IF v_node IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN (SELECT to_jsonb(h) FROM agent_heartbeat(v_node, p_session_id, p_lease_secs, p_clock_ms) AS h);
END
$$;
