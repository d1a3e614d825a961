-- Provider accounts: a tenant's way to an external capacity API (another Better Compute deployment, a cloud). The
-- inline table of `provider_account.*` events; a deleted account's row goes, so its name is free again. Its
-- credential is a sealed secret (`sealed_secrets`, kind `provider-credential`), never here and never in an event.
-- A `provider` pool names the account that backs it in `pools.provider_account_id`; the account is not deleted
-- while one does.
CREATE TABLE provider_accounts (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    provider text NOT NULL,
    endpoint text NOT NULL,
    settings jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL,
    credential_at timestamptz NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE INDEX pools_provider_account ON pools (provider_account_id) WHERE provider_account_id IS NOT NULL;
