-- btree_gist lets a GiST index combine equality on a device id with overlap of a time range: the exclusion
-- constraint that makes a double booking impossible needs it. It is a trusted extension, so a database owner
-- can create it; on services that forbid that, a superuser creates it once before the first migration.
CREATE EXTENSION IF NOT EXISTS btree_gist;
