-- The ceiling of the write path: the writes a reserve and a cancel of one GPU must make at the least, each as one
-- server-side function call, run by pgbench (`ceiling.pgbench`) beside the real commands. `bench reserve` and
-- `bench http` load this file into their database after migrating it and divide their cycle rates by its rate.
--
-- A reserve: the tenant's quota row, two events (requested and placed), the reservation row written once, the
-- booked device touched, the allocation, the booking under the exclusion constraint, the work-queue row of the
-- reservation's next look. A cancel: one event, the reservation row, the device touched, the booking deleted,
-- the reservation's work-queue row and a wake of the pool's pending reservations.
--
-- Each pgbench client books its own device (the `client_id`-th of the pool named `cycles`), so clients never race
-- for an atom, and is a tenant of its own, so clients never wait for one quota row: the ceiling is what PostgreSQL
-- can commit, not a measure of conflicts. `ceiling.pgbench` calls the
-- two functions as two autocommitted statements, passing the reservation's number from one to the other.

CREATE SEQUENCE bench_ceiling_ids;

CREATE FUNCTION bench_ceiling_reserve(p_client integer) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_n bigint := nextval('bench_ceiling_ids');
    v_id text := 'rsv_ceiling' || v_n;
    v_pool_id text := (SELECT id FROM pools WHERE name = 'cycles');
    v_tenant text := 'ceiling' || p_client;
    v_device text;
    v_node text;
    v_now timestamptz := compute_now();
    v_payload bytea := decode(repeat('a1', 320), 'hex');
    v_metadata bytea := decode(repeat('b2', 120), 'hex');
BEGIN
    SELECT id, node_id INTO v_device, v_node FROM devices WHERE pool_id = v_pool_id ORDER BY id OFFSET p_client LIMIT 1;
    INSERT INTO quota_usage AS q (tenant_id, pool_id, resource, checks) VALUES (v_tenant, v_pool_id, 'gpu', 1)
        ON CONFLICT (tenant_id, pool_id, resource) DO UPDATE SET checks = q.checks + 1;
    PERFORM append_events(v_id, v_tenant, 0, ARRAY['reservation.requested', 'reservation.placed'],
                          ARRAY[1, 1]::int2[], ARRAY[v_payload, v_payload], ARRAY[v_metadata, v_metadata]);
    INSERT INTO reservations (id, tenant_id, identity, pool_id, state, resource, count, request, request_hash,
                              priority, requested_at, pending_deadline, start_at, end_at, lease_deadline, version)
        VALUES (v_id, v_tenant, 'ceiling@bench', v_pool_id, 'placed', 'gpu', 1,
                jsonb_build_object('poolId', v_pool_id, 'devices', jsonb_build_object('class', 'gpu', 'count', 1)),
                md5(v_id), 0, v_now, v_now + interval '1 hour', v_now, v_now + interval '1 hour',
                v_now + interval '5 minutes', 2);
    UPDATE devices SET booking_changes = booking_changes + 1 WHERE id = v_device;
    INSERT INTO allocations (id, reservation_id, node_id, devices) VALUES ('alloc_' || v_id, v_id, v_node, ARRAY[v_device]);
    INSERT INTO device_bookings (device_id, allocation_id, reservation_id, tenant_id, pool_id, resource, during)
        VALUES (v_device, 'alloc_' || v_id, v_id, v_tenant, v_pool_id, 'gpu', tstzrange(v_now, v_now + interval '1 hour'));
    INSERT INTO work_queue AS w (key, shard, not_before) VALUES ('rsv:' || v_id, 0, v_now + interval '1 hour')
        ON CONFLICT (key) DO UPDATE SET gen = w.gen + 1, not_before = least(w.not_before, excluded.not_before);
    RETURN v_n;
END
$$;

CREATE FUNCTION bench_ceiling_cancel(p_n bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_rsv text := 'rsv_ceiling' || p_n;
    v_now timestamptz := compute_now();
    v_tenant text;
    v_pool text;
    v_device text;
BEGIN
    SELECT tenant_id, pool_id INTO v_tenant, v_pool FROM reservations WHERE id = v_rsv;
    PERFORM append_events(v_rsv, v_tenant, 2, ARRAY['reservation.cancelled'], ARRAY[1]::int2[],
                          ARRAY[decode(repeat('c3', 60), 'hex')], ARRAY[decode(repeat('b2', 120), 'hex')]);
    UPDATE reservations SET state = 'cancelled', ended_at = v_now, outcome = 'cancelled', version = version + 1
        WHERE id = v_rsv;
    SELECT device_id INTO v_device FROM device_bookings WHERE reservation_id = v_rsv;
    UPDATE devices SET booking_changes = booking_changes + 1 WHERE id = v_device;
    DELETE FROM device_bookings WHERE reservation_id = v_rsv;
    INSERT INTO work_queue AS w (key, shard, not_before) VALUES ('rsv:' || v_rsv, 0, v_now)
        ON CONFLICT (key) DO UPDATE SET gen = w.gen + 1, not_before = least(w.not_before, excluded.not_before);
    INSERT INTO work_queue (key, shard, not_before) VALUES ('pool:' || v_pool || ':pending@' || v_rsv, 1, v_now);
END
$$;
