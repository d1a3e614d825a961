-- The append a command sends in the same message as the inline writes that follow it: a head that does not match
-- is an error here (SQLSTATE BC409) rather than an answer, so that nothing after it in the message runs and the
-- transaction cannot commit half a command. Answers the head it found, the version of the batch's last event and
-- that event's position, separated by spaces.
CREATE FUNCTION append_events_or_refuse(
    p_stream_id text,
    p_tenant_id text,
    p_expected integer,
    p_event_types text[],
    p_schema_versions smallint[],
    p_payloads bytea[],
    p_metadata bytea[])
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v record;
BEGIN
    SELECT * INTO STRICT v
    FROM append_events(p_stream_id, p_tenant_id, p_expected, p_event_types, p_schema_versions, p_payloads,
                       p_metadata);
    IF v.stream_version IS NULL THEN
        RAISE EXCEPTION 'stream % is at version %, not %', p_stream_id, v.head, p_expected
            USING ERRCODE = 'BC409';
    END IF;
    RETURN concat_ws(' ', v.head, v.stream_version, v.log_epoch, v.txid, v.seq);
END
$$;

-- Queues work for the worker (the statement of `queue::enqueue`, which a command can also send with its COMMIT):
-- keys with their shards and the earliest time to look (NULL: now). An earlier wake already queued stays.
CREATE FUNCTION enqueue_work(p_keys text[], p_shards integer[], p_not_before_ms bigint[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO work_queue AS w (key, shard, not_before)
        SELECT u.key, max(u.shard), min(coalesce(timestamptz 'epoch' + u.not_before_ms * interval '1 millisecond',
                                           compute_now()))
        FROM unnest(p_keys, p_shards, p_not_before_ms) AS u(key, shard, not_before_ms)
        GROUP BY u.key
        ORDER BY u.key
        ON CONFLICT (key) DO UPDATE
            SET gen = w.gen + 1,
                not_before = least(w.not_before, excluded.not_before),
                shard = excluded.shard;
END
$$;

-- A stream's events as a command folds them: an array of [type, schema version, payload in hexadecimal, position
-- `<epoch>-<txid>-<seq>`], in stream order (empty when there is no such stream).
CREATE FUNCTION stream_json(p_stream_id text) RETURNS jsonb
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN coalesce(
        (SELECT jsonb_agg(jsonb_build_array(e.event_type, e.schema_version, encode(e.payload, 'hex'),
                                            concat_ws('-', e.log_epoch, e.txid, e.seq))
                          ORDER BY e.stream_version)
         FROM events AS e WHERE e.stream_id = p_stream_id),
        '[]'::jsonb);
END
$$;
