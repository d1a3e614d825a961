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

-- The simulated time, used while compute_now() points at this table.
CREATE TABLE compute_sim_clock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    at timestamptz NOT NULL
);

-- Business time. In production it is the start of the current transaction, so every statement of one command
-- sees the same instant; the body is a bare expression, so PostgreSQL inlines it and a column default costs
-- nothing. use_sim_clock() points it at compute_sim_clock instead, and restore_system_clock() points it back.
CREATE FUNCTION compute_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT now() $$;

-- The database server's real clock, never simulated: what ClockSkew compares a process's clock with.
CREATE FUNCTION compute_db_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() $$;

-- 'system', 'sim', 'custom' (compute_now() was redefined by someone else) or 'missing'.
CREATE FUNCTION compute_now_mode() RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN to_regprocedure('compute_now()') IS NULL THEN 'missing'
        ELSE (SELECT CASE btrim(p.prosrc)
                         WHEN 'SELECT now()' THEN 'system'
                         WHEN 'SELECT c.at FROM compute_sim_clock c WHERE c.singleton' THEN 'sim'
                         ELSE 'custom'
                     END
              FROM pg_proc p WHERE p.oid = to_regprocedure('compute_now()'))
    END
$$;

-- Points compute_now() at the simulated clock, starting at start_at. Database-wide.
CREATE FUNCTION use_sim_clock(start_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql
AS $fn$
BEGIN
    IF start_at IS NULL THEN
        RAISE EXCEPTION 'use_sim_clock: the start time must not be null' USING ERRCODE = '22004';
    END IF;
    INSERT INTO compute_sim_clock (singleton, at) VALUES (true, start_at)
        ON CONFLICT (singleton) DO UPDATE SET at = excluded.at;
    IF compute_now_mode() <> 'sim' THEN
        CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
        LANGUAGE sql STABLE PARALLEL SAFE
        AS $$ SELECT c.at FROM compute_sim_clock c WHERE c.singleton $$;
    END IF;
    RETURN start_at;
END
$fn$;

-- Moves the simulated clock forward. Moving it back is refused: business time never runs backwards.
CREATE FUNCTION set_sim_clock(new_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql
AS $fn$
DECLARE
    current_at timestamptz;
BEGIN
    IF compute_now_mode() <> 'sim' THEN
        RAISE EXCEPTION 'set_sim_clock: the simulated clock is not in use; call use_sim_clock first'
            USING ERRCODE = '55000';
    END IF;
    SELECT at INTO current_at FROM compute_sim_clock WHERE singleton FOR UPDATE;
    IF new_at IS NULL OR new_at < current_at THEN
        RAISE EXCEPTION 'set_sim_clock: % is before the simulated clock''s %; it only moves forward',
            new_at, current_at USING ERRCODE = '22023';
    END IF;
    UPDATE compute_sim_clock SET at = new_at WHERE singleton;
    RETURN new_at;
END
$fn$;

-- Points compute_now() back at the server's clock.
CREATE FUNCTION restore_system_clock() RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() $$;
END
$fn$;
