-- The first answer to each create request sent with an Idempotency-Key, per caller and key, so that a retry is
-- answered it instead of running again. A row without a status is a request still running. The answer is
-- sealed with the PKI bundle's key when the control plane has one.
CREATE TABLE idempotency_keys (
    tenant_id text NOT NULL,
    identity text NOT NULL,
    key text NOT NULL,
    method text NOT NULL,
    request_sha256 text NOT NULL,
    status integer,
    answer bytea,
    sealed boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, identity, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
