-- The exclusion constraint that keeps two bookings of one atom apart now compares a number per atom instead of
-- its text id.
--
-- Its GiST index held (device_id, during). For a text column btree_gist keeps each entry's bounds as variable-length
-- text, decompressed and compared byte by byte at every step of an insert and of the overlap check that precedes
-- it. In the benchmark's pool of 1,000 nodes half booked, inserting the eight bookings of an 8-GPU reservation took
-- 0.75 to 1.36 ms, 0.4 to 1.0 ms of it that index (the same insert with the constraint dropped: 0.28 to 0.38 ms);
-- keyed by a bigint it took 0.35 to 0.42 ms. The guarantee is the same: each device id has exactly one number, kept
-- for the life of the database, so two bookings of one atom always share their number.
--
-- * `atom_numbers` gives every device id ever seen its number. Rows are never deleted: a device removed from its
--   node and reported again later (the same GPU, or the same UUID reported by another node) keeps its number, so
--   a booking made before the removal still excludes the ones made after it.
-- * A device is numbered when it is inserted (a statement trigger on `devices`); a booking of an id nobody numbered
--   yet (a rebuild into another schema, a bulk load) numbers it on the spot.
-- * `device_bookings.atom` is set from it by a row trigger on every insert and on every change of `device_id`, so no
--   writer can give a booking another atom's number. The torture test checks every booking's number against the
--   table.

CREATE TABLE atom_numbers (
    device_id text PRIMARY KEY,
    atom bigint GENERATED ALWAYS AS IDENTITY
);

INSERT INTO atom_numbers (device_id)
SELECT id FROM devices UNION SELECT device_id FROM device_bookings ORDER BY 1;

-- Numbers a device id that has no number yet (the booking trigger below looks the number up first), and answers
-- its number. A concurrent transaction numbering the same id first makes this one wait for it; under REPEATABLE
-- READ that ends in a serialization failure, which the command retries.
CREATE FUNCTION number_atom(p_device text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_atom bigint;
BEGIN
    INSERT INTO atom_numbers (device_id) VALUES (p_device)
    ON CONFLICT (device_id) DO NOTHING
    RETURNING atom INTO v_atom;
    IF v_atom IS NULL THEN
        SELECT n.atom INTO v_atom FROM atom_numbers AS n WHERE n.device_id = p_device;
    END IF;
    IF v_atom IS NULL THEN
        RAISE EXCEPTION 'device % was numbered by a transaction this one cannot see', p_device
            USING ERRCODE = '40001';
    END IF;
    RETURN v_atom;
END
$$;

CREATE FUNCTION atom_numbers_after_device_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO atom_numbers (device_id)
    SELECT r.id FROM new_rows AS r ORDER BY r.id
    ON CONFLICT (device_id) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER atom_numbers_device_insert AFTER INSERT ON devices
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION atom_numbers_after_device_insert();

CREATE FUNCTION device_bookings_set_atom() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    SELECT n.atom INTO NEW.atom FROM atom_numbers AS n WHERE n.device_id = NEW.device_id;
    IF NEW.atom IS NULL THEN
        NEW.atom := number_atom(NEW.device_id);
    END IF;
    RETURN NEW;
END
$$;

-- The bookings already there get their numbers (an update of a new column only: the gaps do not move, so their
-- trigger is off meanwhile).
ALTER TABLE device_bookings DISABLE TRIGGER atom_gaps_booking_update;
ALTER TABLE device_bookings ADD COLUMN atom bigint;
UPDATE device_bookings AS b SET atom = n.atom FROM atom_numbers AS n WHERE n.device_id = b.device_id;
ALTER TABLE device_bookings ENABLE TRIGGER atom_gaps_booking_update;
ALTER TABLE device_bookings ALTER COLUMN atom SET NOT NULL;

CREATE TRIGGER device_bookings_atom BEFORE INSERT OR UPDATE OF device_id ON device_bookings
    FOR EACH ROW EXECUTE FUNCTION device_bookings_set_atom();

ALTER TABLE device_bookings DROP CONSTRAINT device_bookings_no_overlap;
ALTER TABLE device_bookings
    ADD CONSTRAINT device_bookings_no_overlap EXCLUDE USING gist (atom WITH =, during WITH &&);

-- The constraint's index also answered the reads of one device's bookings (the ends of an atom's other bookings
-- when one ends, a quote's or a whole node's overlap check), which name the device id, not its number. Those reads
-- now use a btree on the device and the booking's end. It replaces the partial one over live bookings: every
-- booking in the table is live since capacity/0009, so the predicate kept no row out, and reads that do not say
-- `live` could not use it.
CREATE INDEX device_bookings_device_ends ON device_bookings (device_id, upper(during));
DROP INDEX device_bookings_live;
