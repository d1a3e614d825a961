-- Tamper-evident audit: per tenant and hour, a signed Merkle checkpoint over the audit trail's entries.
--
-- A tenant's checkpoints are a chain: each names its sequence number and the hash of the one before (zeros for
-- the first), and the service makes one per (tenant, hour) at most, once: the two unique keys below are what
-- keeps several processes from making two, or forking the chain. A checkpoint covers the tenant's entries in
-- log position order from just after its previous checkpoint's last position to its own last position; those
-- positions, the count and the root are signed, with the audit key derived from the PKI bundle's sealing key.
CREATE TABLE audit_checkpoints (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    sequence bigint NOT NULL CHECK (sequence >= 1),
    hour_start timestamptz NOT NULL,
    first_epoch integer NOT NULL,
    first_txid xid8 NOT NULL,
    first_seq bigint NOT NULL,
    first_position text NOT NULL,
    last_epoch integer NOT NULL,
    last_txid xid8 NOT NULL,
    last_seq bigint NOT NULL,
    last_position text NOT NULL,
    leaf_count integer NOT NULL CHECK (leaf_count >= 1),
    root bytea NOT NULL CHECK (length(root) = 32),
    previous_hash bytea NOT NULL CHECK (length(previous_hash) = 32),
    hash bytea NOT NULL CHECK (length(hash) = 32),
    -- The signing key's public half (hex), so a rotated bundle's older checkpoints say which key signed them.
    public_key text NOT NULL,
    signature bytea NOT NULL CHECK (length(signature) = 64),
    made_at timestamptz NOT NULL DEFAULT compute_now(),
    UNIQUE (tenant_id, sequence),
    UNIQUE (tenant_id, hour_start)
);

-- Each checkpoint's leaves, in order: the position each came from and its leaf hash. They let a verification
-- name the entry that changed (a root alone only says that one did), and serve inclusion proofs without
-- reading the entries again. They are bound by the signed root: a changed leaf no longer makes it.
CREATE TABLE audit_checkpoint_leaves (
    checkpoint_id text NOT NULL REFERENCES audit_checkpoints (id),
    leaf_index integer NOT NULL CHECK (leaf_index >= 0),
    log_epoch integer NOT NULL,
    txid xid8 NOT NULL,
    seq bigint NOT NULL,
    leaf_hash bytea NOT NULL CHECK (length(leaf_hash) = 32),
    PRIMARY KEY (checkpoint_id, leaf_index)
);
-- A proof is asked for by an entry's position.
CREATE UNIQUE INDEX audit_checkpoint_leaves_position ON audit_checkpoint_leaves (log_epoch, txid, seq);
