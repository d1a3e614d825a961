-- Workflows: the inline tables of the workflow events. `workflows` holds each workflow and how it ended;
-- `workflow_steps` its persisted steps, one row each, with where each is (pending, running an attempt until its
-- deadline, succeeded, failed). At most one workflow runs on a machine at a time.
CREATE TABLE workflows (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    node_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('inspect', 'deploy', 'release')),
    profile_id text,
    outcome text CHECK (outcome IN ('succeeded', 'failed', 'cancelled')),
    reason text,
    created_at timestamptz NOT NULL,
    ended_at timestamptz
);
CREATE UNIQUE INDEX workflows_one_running_per_node ON workflows (node_id) WHERE outcome IS NULL;
CREATE INDEX workflows_node ON workflows (node_id, id);
CREATE INDEX workflows_profile ON workflows (profile_id) WHERE profile_id IS NOT NULL;

CREATE TABLE workflow_steps (
    workflow_id text NOT NULL,
    index integer NOT NULL,
    name text NOT NULL,
    action text NOT NULL,
    runs_on text NOT NULL CHECK (runs_on IN ('control-plane', 'site', 'node', 'ramdisk')),
    timeout_s integer NOT NULL,
    attempts integer NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    attempt integer NOT NULL DEFAULT 0,
    started_at timestamptz,
    deadline timestamptz,
    ended_at timestamptz,
    detail text,
    PRIMARY KEY (workflow_id, index)
);
-- What the site agents and ramdisks look for: the running steps of each place.
CREATE INDEX workflow_steps_running ON workflow_steps (runs_on, workflow_id) WHERE state = 'running';
