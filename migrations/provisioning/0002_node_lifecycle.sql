-- Machines enrolled from their BMC: the inline table of `node.bmc_set` (the address and the driver of each
-- concern; the credentials are a sealed secret of kind `bmc-credentials`, never here), and since when a node is
-- in its `provisionState` when that state has a time limit.
CREATE TABLE node_bmcs (
    node_id text PRIMARY KEY,
    driver text NOT NULL CHECK (driver IN ('redfish', 'ipmi')),
    address text NOT NULL,
    system_id text,
    insecure_tls boolean NOT NULL,
    drivers jsonb NOT NULL
);
ALTER TABLE nodes ADD COLUMN provision_since timestamptz;
