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
