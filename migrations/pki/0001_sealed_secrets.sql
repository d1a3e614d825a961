-- The pki module: secrets the control plane must keep (a BMC's password, a provider's key), sealed with the
-- PKI bundle's sealing key (XChaCha20-Poly1305, bound to the row's kind and owner), never in the clear, never
-- in events. A secret is replaced whole; reading it needs the bundle it was sealed with.
CREATE TABLE sealed_secrets (
    kind text NOT NULL,
    owner_id text NOT NULL,
    sealed bytea NOT NULL,
    sealed_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (kind, owner_id)
);
