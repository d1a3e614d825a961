-- The event log. Positions are (log_epoch, txid, seq). Readers never trust seq alone: commit order is not seq
-- order, so they read in (log_epoch, txid, seq) order only the rows that no transaction still running can
-- precede (txid below the snapshot's xmin, or an older epoch).

-- The epoch rises when the log moves into a cluster whose transaction ids start lower (a logical restore),
-- so that older events stay readable and newer ones sort after them.
CREATE TABLE event_log_epoch (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch integer NOT NULL CHECK (epoch >= 1),
    raised_at timestamptz NOT NULL DEFAULT compute_now()
);
INSERT INTO event_log_epoch (epoch) VALUES (1);

CREATE TABLE events (
    log_epoch integer NOT NULL,
    txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    seq bigint GENERATED ALWAYS AS IDENTITY,
    stream_id text NOT NULL CHECK (stream_id <> ''),
    stream_version integer NOT NULL CHECK (stream_version >= 1),
    event_type text NOT NULL CHECK (event_type <> ''),
    schema_version smallint NOT NULL CHECK (schema_version >= 1),
    tenant_id text,
    payload bytea NOT NULL,
    metadata bytea NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (log_epoch, txid, seq),
    CONSTRAINT events_stream_version_key UNIQUE (stream_id, stream_version)
);

-- Appends a batch of events to one stream when its head is at p_expected (any head when NULL). Returns the head
-- it found, and the position and version of the batch's last event; those are NULL when the head did not
-- match and nothing was written. A concurrent appender of the same version loses on the unique key. A
-- function rather than a statement sent by the client, because PostgreSQL keeps a function's plans for the
-- life of the session, which a client behind PgBouncer (unnamed statements only) cannot.
CREATE FUNCTION append_events(
    p_stream_id text,
    p_tenant_id text,
    p_expected integer,
    p_event_types text[],
    p_schema_versions smallint[],
    p_payloads bytea[],
    p_metadata bytea[],
    OUT head integer,
    OUT log_epoch integer,
    OUT txid text,
    OUT seq bigint,
    OUT stream_version integer)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    SELECT coalesce(max(e.stream_version), 0) INTO head FROM events AS e WHERE e.stream_id = p_stream_id;
    IF p_expected IS NOT NULL AND head <> p_expected THEN
        RETURN;
    END IF;
    WITH appended AS (
        INSERT INTO events (log_epoch, stream_id, stream_version, event_type, schema_version, tenant_id,
                            payload, metadata)
        SELECT cur.epoch, p_stream_id, head + u.ord::integer, u.event_type, u.schema_version, p_tenant_id,
               u.payload, u.metadata
        FROM event_log_epoch AS cur,
             unnest(p_event_types, p_schema_versions, p_payloads, p_metadata)
                 WITH ORDINALITY AS u(event_type, schema_version, payload, metadata, ord)
        ORDER BY u.ord
        RETURNING events.log_epoch, events.txid, events.seq, events.stream_version
    )
    SELECT a.log_epoch, a.txid::text, a.seq, a.stream_version
    INTO log_epoch, txid, seq, stream_version
    FROM appended AS a
    ORDER BY a.seq DESC
    LIMIT 1;
END
$$;
