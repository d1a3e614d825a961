-- The one clock. Every statement reads business time through compute_now(), column defaults included; this
-- is the only file allowed to read the server's clock directly. Tests and the simulator switch compute_now()
-- to a simulated clock that only moves forward.
--
-- It also creates the migrations ledger, which the runner bootstraps before any migration: recreating it
-- here is a no-op kept for databases migrated by hand.

CREATE TABLE IF NOT EXISTS compute_migrations (
    name text PRIMARY KEY,
    applied_at timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS compute_schema_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version integer NOT NULL CHECK (version >= 0)
);

CREATE TABLE compute_sim_clock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    active boolean NOT NULL DEFAULT false,
    at timestamptz,
    CHECK (NOT active OR at IS NOT NULL)
);
INSERT INTO compute_sim_clock (singleton, active, at) VALUES (true, false, NULL);

-- Business time: the simulated clock when one is in use, otherwise the start of the current transaction, so
-- that every statement of one command sees the same instant.
CREATE FUNCTION compute_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT coalesce((SELECT c.at FROM compute_sim_clock c WHERE c.active), now()) $$;

-- The database server's real clock, never simulated: what ClockSkew compares a process's clock with.
CREATE FUNCTION compute_db_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() $$;

CREATE FUNCTION use_sim_clock(start_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql
AS $$
BEGIN
    IF start_at IS NULL THEN
        RAISE EXCEPTION 'use_sim_clock: the start time must not be null' USING ERRCODE = '22004';
    END IF;
    UPDATE compute_sim_clock SET active = true, at = start_at WHERE singleton;
    RETURN start_at;
END
$$;

-- Moves the simulated clock forward. Moving it back is refused: business time never runs backwards.
CREATE FUNCTION set_sim_clock(new_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    current_at timestamptz;
BEGIN
    SELECT at INTO current_at FROM compute_sim_clock WHERE singleton AND active FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'set_sim_clock: the simulated clock is not in use; call use_sim_clock first'
            USING ERRCODE = '55000';
    END IF;
    IF new_at IS NULL OR new_at < current_at THEN
        RAISE EXCEPTION 'set_sim_clock: % is before the simulated clock''s %; it only moves forward',
            new_at, current_at USING ERRCODE = '22023';
    END IF;
    UPDATE compute_sim_clock SET at = new_at WHERE singleton;
    RETURN new_at;
END
$$;

CREATE FUNCTION restore_system_clock() RETURNS void
LANGUAGE sql
AS $$ UPDATE compute_sim_clock SET active = false, at = NULL WHERE singleton $$;

-- 'system', 'sim', 'custom' (compute_now() was redefined by someone else) or 'missing'.
CREATE FUNCTION compute_now_mode() RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN to_regprocedure('compute_now()') IS NULL THEN 'missing'
        WHEN (SELECT btrim(p.prosrc) FROM pg_proc p WHERE p.oid = to_regprocedure('compute_now()'))
             <> 'SELECT coalesce((SELECT c.at FROM compute_sim_clock c WHERE c.active), now())' THEN 'custom'
        WHEN (SELECT c.active FROM compute_sim_clock c WHERE c.singleton) THEN 'sim'
        ELSE 'system'
    END
$$;
