-- A join token an operator revoked admits nobody, like a used or expired one.
ALTER TABLE join_tokens ADD COLUMN revoked_at timestamptz;
CREATE INDEX join_tokens_pool ON join_tokens (pool_id, id);
