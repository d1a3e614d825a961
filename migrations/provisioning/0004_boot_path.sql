-- The boot path: the MAC address a machine boots from the network with (how the site agent knows which machine
-- asks for its iPXE script), and the ramdisk's credentials. A boot credential (`boot`) is handed to one boot of
-- the ramdisk in its iPXE script and is claimed once for a session (`session`) bound to the same workflow and
-- machine; only hashes are kept. A later boot's claim ends the earlier sessions of the workflow, and a session
-- ends with its workflow.
ALTER TABLE node_bmcs ADD COLUMN boot_mac text;
CREATE UNIQUE INDEX node_bmcs_boot_mac ON node_bmcs (boot_mac) WHERE boot_mac IS NOT NULL;

CREATE TABLE ramdisk_credentials (
    secret_sha256 text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('boot', 'session')),
    workflow_id text NOT NULL,
    node_id text NOT NULL,
    expires_at timestamptz NOT NULL,
    claimed_at timestamptz
);
CREATE INDEX ramdisk_credentials_workflow ON ramdisk_credentials (workflow_id);
