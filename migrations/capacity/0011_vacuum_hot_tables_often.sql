-- The tables every reserve and cancel rewrites (each cycle deletes and inserts an atom's gaps, a booking and a
-- quota claim, and updates a node's free count, the devices it touches, the tenant's usage row and the work
-- queue) stay a few hundred live rows while their dead versions pile up at hundreds a second. PostgreSQL's
-- default (vacuum once a fifth of the table is dead) lets a 500-row table carry tens of thousands of dead rows
-- between two autovacuum rounds, and every index probe walks them: a reserve's latency rose by a fifth over a
-- few thousand cycles and fell back after a VACUUM. Vacuum these once a thousand rows are dead, however small
-- the table, and without the cost-based pauses (each such vacuum is a few milliseconds). How soon a vacuum
-- starts after that also depends on `autovacuum_naptime` (docs/operations.md).
ALTER TABLE atom_gaps SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                           autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE node_free SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                           autovacuum_vacuum_cost_delay = 0);
ALTER TABLE device_bookings SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                                 autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE quota_claims SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                              autovacuum_vacuum_cost_delay = 0);
ALTER TABLE quota_usage SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                             autovacuum_vacuum_cost_delay = 0);
ALTER TABLE devices SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                         autovacuum_vacuum_cost_delay = 0);
ALTER TABLE work_queue SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                            autovacuum_vacuum_cost_delay = 0);
