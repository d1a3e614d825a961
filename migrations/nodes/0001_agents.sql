-- The nodes module: what agent-joined machines add to the capacity tables, and the runtime rows of joining,
-- credentials, sessions, inventory snapshots and commands.

-- Inline columns, kept from node events like the rest of the nodes table.
ALTER TABLE nodes
    ADD COLUMN draining boolean NOT NULL DEFAULT false,
    -- The current drain was forced: what still runs on the node is ended rather than waited for.
    ADD COLUMN drain_forced boolean NOT NULL DEFAULT false,
    ADD COLUMN hardware_key text,
    ADD COLUMN hardware_trusted boolean NOT NULL DEFAULT false,
    ADD COLUMN spec jsonb NOT NULL DEFAULT '{}';

-- Each identifier that survived the placeholder blocklist, one by one, so a machine that comes back with a GPU or
-- NIC swapped is found by the ones that stayed. Inline, from node.joined and node.hardware_changed.
CREATE TABLE node_identifiers (
    node_id text NOT NULL,
    kind text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (node_id, kind, value)
);
CREATE INDEX node_identifiers_value ON node_identifiers (kind, value);

-- Join tokens: single use, with a time to live, scoped to a pool. Only the SHA-256 of the secret is kept.
CREATE TABLE join_tokens (
    id text PRIMARY KEY,
    secret_sha256 text NOT NULL UNIQUE,
    pool_id text NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT compute_now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz,
    node_id text
);

-- Node credentials: a secret issued at join and at each rotation. A rotated secret is unconfirmed until its
-- first use, which confirms it and revokes the node's other secrets, so a rotation whose answer was lost never
-- locks the agent out. Deleting the node deletes them.
CREATE TABLE node_credentials (
    secret_sha256 text PRIMARY KEY,
    node_id text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT compute_now(),
    confirmed boolean NOT NULL DEFAULT true
);
CREATE INDEX node_credentials_node ON node_credentials (node_id);

-- One session per node: the agent's liveness lease, renewed by every heartbeat. Runtime rows, never events; only
-- a change of connectivity is an event. The liveness sweep reads one shard at a time, by expiry.
CREATE TABLE agent_sessions (
    node_id text PRIMARY KEY,
    session_id text NOT NULL,
    shard integer NOT NULL CHECK (shard >= 0),
    agent_version text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT compute_now(),
    heartbeat_at timestamptz NOT NULL DEFAULT compute_now(),
    expires_at timestamptz NOT NULL,
    heartbeats bigint NOT NULL DEFAULT 0,
    clock_skew_ms bigint
);
CREATE INDEX agent_sessions_sweep ON agent_sessions (shard, expires_at);

-- Every accepted inventory document, append-only: a change adds a snapshot, nothing rewrites one.
CREATE TABLE node_inventory_snapshots (
    node_id text NOT NULL,
    snapshot bigint NOT NULL CHECK (snapshot >= 1),
    document jsonb NOT NULL,
    hashes jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (node_id, snapshot)
);

CREATE FUNCTION node_inventory_snapshots_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'node_inventory_snapshots is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER node_inventory_snapshots_append_only BEFORE UPDATE OR DELETE ON node_inventory_snapshots
    FOR EACH ROW EXECUTE FUNCTION node_inventory_snapshots_append_only();

-- Commands to nodes: per-node seq from 1, delivered in seq order once not_before is reached and the node has
-- observed min_generation; one still queued past not_after becomes expired and is skipped.
CREATE TABLE node_command_seqs (
    node_id text PRIMARY KEY,
    last_seq bigint NOT NULL
);

CREATE TABLE node_commands (
    id text PRIMARY KEY,
    node_id text NOT NULL,
    seq bigint NOT NULL CHECK (seq >= 1),
    kind text NOT NULL,
    body jsonb NOT NULL,
    reservation_id text,
    not_before timestamptz NOT NULL,
    not_after timestamptz,
    min_generation bigint,
    state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'succeeded', 'failed', 'expired')),
    created_at timestamptz NOT NULL DEFAULT compute_now(),
    first_delivered_at timestamptz,
    deliveries integer NOT NULL DEFAULT 0,
    finished_at timestamptz,
    message text,
    UNIQUE (node_id, seq)
);
CREATE INDEX node_commands_queued ON node_commands (node_id, seq) WHERE state = 'queued';
CREATE INDEX node_commands_reservation ON node_commands (reservation_id) WHERE reservation_id IS NOT NULL;

-- A heartbeat in one call: renew the session `p_session_id` of node `p_node_id` and answer what the reply needs.
-- A function so that PostgreSQL keeps its plan for the session (an unnamed statement would be planned on every
-- heartbeat). Over HTTP the node comes from its credential in the calling statement
-- (`agent_heartbeat((SELECT node_id FROM node_credentials WHERE ...), ...)`). No row: no such node, or the session
-- is not the node's current one.
CREATE FUNCTION agent_heartbeat(p_node_id text, p_session_id text, p_lease_secs double precision, p_clock_ms bigint)
RETURNS TABLE (
    node_id text, pool_id text, tenant_id text, expires_ms bigint, clock_skew_ms bigint, connectivity text,
    generation bigint, observed_generation bigint, spec text, skew_raised boolean, waiting boolean
)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH s AS (
        UPDATE agent_sessions AS a
           SET heartbeat_at = compute_now(), expires_at = compute_now() + make_interval(secs => p_lease_secs),
               heartbeats = a.heartbeats + 1, clock_skew_ms = p_clock_ms - ts_ms(compute_db_clock())
         WHERE a.node_id = p_node_id AND a.session_id = p_session_id
        RETURNING a.node_id, a.clock_skew_ms, ts_ms(a.expires_at) AS expires_ms)
    SELECT s.node_id, n.pool_id, p.owner_tenant_id, s.expires_ms, s.clock_skew_ms, n.connectivity, n.generation,
           n.observed_generation, n.spec::text, n.conditions @> '[{"type": "ClockSkew"}]'::jsonb,
           EXISTS (SELECT 1 FROM node_commands AS q
                   WHERE q.node_id = n.id AND q.state = 'queued' AND q.not_before <= compute_now())
    FROM s JOIN nodes AS n ON n.id = s.node_id JOIN pools AS p ON p.id = n.pool_id;
END
$$;
