-- The audit trail is read by position, for everyone or for one tenant; no read looks it up by stream (a stream's
-- history is the log's own `(stream_id, stream_version)` key). Its index by stream was about a quarter of the
-- cost of writing the table (measured with INSERT ... SELECT of 600,000 rows) and served nothing.
DROP INDEX audit_events_v1_stream;
