-- A placement's chosen atoms locked in the message that carries its events and COMMIT (`store::lock_with_commit`).
-- While the process has seen no race for atoms lately, a reserve plans on the facts its first round trip read and
-- sends this lock ahead of its events, saving the round trip of locking first. The lock is `lock_chosen`'s: the
-- chosen nodes re-read for share, the atoms locked skipping those another transaction holds or changed since the
-- snapshot. When a node is no longer schedulable or an atom was not locked, it raises (BC423), so that nothing of
-- the message is written; the reserve then plans again, locking first.
CREATE FUNCTION lock_chosen_or_refuse(p_nodes text[], p_atoms text[]) RETURNS text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v jsonb := lock_chosen(p_nodes, p_atoms, true);
BEGIN
    IF (v ->> 'schedulable')::bigint <> cardinality(p_nodes)
       OR jsonb_array_length(v -> 'locked') <> cardinality(p_atoms) THEN
        RAISE EXCEPTION 'the chosen atoms were taken: % of % locked, % of % nodes schedulable',
            jsonb_array_length(v -> 'locked'), cardinality(p_atoms), v ->> 'schedulable', cardinality(p_nodes)
            USING ERRCODE = 'BC423';
    END IF;
    RETURN 'locked';
END
$$;
