-- A placement's lock of its chosen atoms skips an atom another command booked (or freed) and committed after this
-- command's snapshot, as it already skipped one another command holds, instead of failing the whole command.
--
-- At repeatable read, `FOR UPDATE SKIP LOCKED` skips rows other transactions hold but raises a serialization failure
-- (40001) for a row whose newest version committed after the snapshot. With sixteen clients a third of the reserve
-- cycles of `bench reserve` were retried whole for that, every one at this lock: concurrent requests choose from the
-- same summary, and the one that loses the race for an atom learns it here. The failure is caught per atom in a
-- subtransaction: the atoms locked are exactly those whose version in the snapshot is their newest, so what the
-- command decided about them still holds, and the caller plans again without the others (as for atoms held). The
-- snapshot never sees the newer version; the command simply does not book that atom. One subtransaction covers the
-- whole lock when nothing changed; only when something did is each atom tried in one of its own.
CREATE OR REPLACE FUNCTION lock_chosen(p_nodes text[], p_atoms text[], p_skip_held boolean) RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_schedulable bigint;
    v_locked text[];
    v_atom text;
BEGIN
    SELECT count(*) INTO v_schedulable
    FROM (SELECT 1 FROM nodes WHERE id = ANY(p_nodes) AND schedulable ORDER BY id FOR SHARE) AS n;
    IF NOT p_skip_held THEN
        v_locked := ARRAY(SELECT id FROM devices WHERE id = ANY(p_atoms) ORDER BY id FOR UPDATE);
    ELSE
        BEGIN
            v_locked := ARRAY(SELECT id FROM devices WHERE id = ANY(p_atoms) ORDER BY id FOR UPDATE SKIP LOCKED);
        EXCEPTION WHEN serialization_failure THEN
            v_locked := '{}';
            FOR v_atom IN SELECT id FROM devices WHERE id = ANY(p_atoms) ORDER BY id LOOP
                BEGIN
                    PERFORM 1 FROM devices WHERE id = v_atom FOR UPDATE SKIP LOCKED;
                    IF FOUND THEN
                        v_locked := v_locked || v_atom;
                    END IF;
                EXCEPTION WHEN serialization_failure THEN
                    NULL;
                END;
            END LOOP;
        END;
    END IF;
    RETURN jsonb_build_object('schedulable', v_schedulable, 'locked', to_jsonb(v_locked));
END
$$;
