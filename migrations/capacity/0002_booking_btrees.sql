-- The reads of device_bookings ask for bookings that end after some instant: placement (those of a pool that
-- reach into a window), the quota sweep (those of a holder), earliest start (the next end after an instant).
-- Btrees on the end answer them in order and skip every booking that has already ended (an ended or cancelled
-- booking is truncated at its end, an unstarted one to empty, whose upper bound is NULL and so never matches);
-- the two secondary GiST indexes gave way to them. The exclusion constraint's GiST index stays the guard.
DROP INDEX device_bookings_tenant;
DROP INDEX device_bookings_pool;
CREATE INDEX device_bookings_ends ON device_bookings (pool_id, upper(during));
CREATE INDEX device_bookings_holder ON device_bookings (tenant_id, pool_id, resource, upper(during));
