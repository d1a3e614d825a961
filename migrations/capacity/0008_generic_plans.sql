-- Two functions every booking statement runs whose plans PostgreSQL made again on every call: `pg_stat_statements`
-- under `bench reserve --statements` showed the gaps' refresh planned for 0.30 ms to run for 0.12 ms, twice a cycle
-- (the insert's and the end's trigger), and the devices' lock and touch planned for 0.11 ms to run for 0.03 ms.
-- Their statements read a handful of rows by key (`= ANY` of the atoms a statement changed), so one plan suits
-- every call: PL/pgSQL keeps it for the session instead of weighing a custom plan each time.
ALTER FUNCTION refresh_atom_gaps(text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION touch_for_booking(text[], bigint) SET plan_cache_mode = force_generic_plan;
