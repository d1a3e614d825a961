-- Whole nodes for tenants (`binding: node` in `policy.tenantRoot` pools): a workflow a reservation started carries
-- its id, so the reservation's hand-over can tell its own deployments and wipes from the machine's other workflows,
-- and placement can tell a machine deployed for a tenant from one an operator deployed.
ALTER TABLE workflows ADD COLUMN reservation_id text;
CREATE INDEX workflows_reservation ON workflows (reservation_id, node_id, id) WHERE reservation_id IS NOT NULL;

-- The whole-node atoms of a pool: `store::whole_nodes` reads them by pool and class.
CREATE INDEX devices_whole_nodes ON devices (pool_id, node_id) WHERE class = 'node';

-- A ramdisk whose claim's answer was lost may claim again with the same boot credential, as long as the session
-- that claim made was never used: each session remembers the boot credential that claimed it and its first use.
ALTER TABLE ramdisk_credentials ADD COLUMN boot_sha256 text, ADD COLUMN used_at timestamptz;
