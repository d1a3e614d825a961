-- The webhooks module: tenants' subscriptions to events of some types, POSTed signed to a URL of their own.
-- `webhooks` is the inline table of `webhook.*` events (a deleted subscription's row goes); its signing secret
-- is a sealed secret (`sealed_secrets`, kind `webhook-secret`), never here and never in an event.
CREATE TABLE webhooks (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    url text NOT NULL,
    event_types jsonb NOT NULL,
    description text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    secret_at timestamptz NOT NULL
);

CREATE INDEX webhooks_by_tenant ON webhooks (tenant_id, id);

-- Runtime rows of delivery, written by the process holding the subscription's `webhook:<id>` lease in
-- transactions fenced by it, and removed with the subscription. Not events: a rebuild of the inline tables does
-- not touch them.
--
-- Where a subscription's deliveries stand: every event of the log up to `position` (`<epoch>-<txid>-<seq>`) is
-- delivered (acknowledged by a 2xx), dead-lettered or not one the subscription wants. It starts at the
-- subscription's own `webhook.created` event and only moves forward.
CREATE TABLE webhook_cursors (
    webhook_id text PRIMARY KEY,
    position text NOT NULL,
    delivered bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT compute_now()
);

-- Every attempt of a delivery (kept a week): its message id (the `webhook-id` header, the same on every retry),
-- the answer's status or why there was none.
CREATE TABLE webhook_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id text NOT NULL,
    message_id text NOT NULL,
    position text NOT NULL,
    event_type text NOT NULL,
    attempt integer NOT NULL,
    at timestamptz NOT NULL DEFAULT compute_now(),
    status integer,
    error text,
    outcome text NOT NULL CHECK (outcome IN ('delivered', 'failed', 'dead'))
);

CREATE INDEX webhook_attempts_by_webhook ON webhook_attempts (webhook_id, id);

-- Events whose delivery failed every attempt: kept until a replay delivers them (`queued`: asked to be sent
-- again, before the cursor's next events).
CREATE TABLE webhook_dead_letters (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id text NOT NULL,
    position text NOT NULL,
    event_type text NOT NULL,
    attempts integer NOT NULL,
    last_error text NOT NULL,
    dead_at timestamptz NOT NULL DEFAULT compute_now(),
    queued boolean NOT NULL DEFAULT false,
    UNIQUE (webhook_id, position)
);
