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
