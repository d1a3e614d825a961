-- Node certificates the bundle's CA signed: one at each join and each rotation. A deleted node's certificates
-- are revoked; the API serves the revoked ones as a signed revocation list and refuses them at the handshake.
CREATE TABLE node_certificates (
    serial text PRIMARY KEY,
    node_id text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT compute_now(),
    not_after timestamptz NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX node_certificates_node ON node_certificates (node_id);
CREATE INDEX node_certificates_revoked ON node_certificates (revoked_at) WHERE revoked_at IS NOT NULL;
