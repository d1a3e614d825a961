-- The inline writes of the reservation events a command records, one server-side function each, so that a command
-- sends them in the message that appends its events (`events::append_with`) and PostgreSQL keeps their plans for
-- the session (PL/pgSQL: a SQL-language function is planned again on every call). A rebuild from the log calls the
-- same functions: there is one implementation of each write.

-- A reservation's row, written whole by the first event of its stream (requested, or denied).
CREATE FUNCTION inline_reservation_row(
    p_id text, p_tenant text, p_identity text, p_pool text, p_project text, p_state text, p_resource text,
    p_count integer, p_request jsonb, p_request_hash text, p_priority integer, p_requested_ms bigint,
    p_pending_deadline_ms bigint, p_ended_ms bigint, p_outcome text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO reservations (id, tenant_id, identity, pool_id, project_id, state, resource, count, request,
                                  request_hash, priority, requested_at, pending_deadline, ended_at, outcome, version)
        VALUES (p_id, p_tenant, p_identity, p_pool, p_project, p_state, p_resource, p_count, p_request, p_request_hash,
                p_priority, ms_ts(p_requested_ms), ms_ts(p_pending_deadline_ms), ms_ts(p_ended_ms), p_outcome, 1);
END
$$;

-- A transition that changes only the state (binding, active).
CREATE FUNCTION inline_reservation_state(p_id text, p_state text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE reservations SET state = p_state, version = version + 1 WHERE id = p_id;
END
$$;

CREATE FUNCTION inline_release_requested(p_id text, p_at_ms bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE reservations SET state = 'releasing', release_requested_at = ms_ts(p_at_ms), version = version + 1
        WHERE id = p_id;
END
$$;

CREATE FUNCTION inline_renewed(p_id text, p_lease_deadline_ms bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE reservations SET lease_deadline = ms_ts(p_lease_deadline_ms), version = version + 1 WHERE id = p_id;
END
$$;
