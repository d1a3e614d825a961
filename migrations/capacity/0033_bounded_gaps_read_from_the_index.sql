-- Two reads of the bounded gaps (those between two bookings) each cost more than the gaps they returned.
--
-- * The btree by where a gap ends (capacity/0032) answered the tightest-fit sample with an index scan that visited
--   the table for every gap it returned. The read names the `gap` column: its bounds are keys of the index, but the
--   planner reads a row from an index alone only when every column the query names is in it. A round of 512 gaps
--   visited about 300 table pages.
-- * The gaps that contain a window were read through a GiST index over (pool, class, gap). It returned them in no
--   useful order and slowly: 1.2 to 2.4 ms for a few hundred gaps at fleet size, every one of the cases where round 1
--   of `gap_candidates` runs, and every full read (round 4, the availability listing).
--
-- Both now read an index alone (`gap` rides along in each). The containment read goes through a btree of the gaps
-- grouped by length class: class k holds the gaps that last 2^k to 2^(k+1) seconds (`gap_length_class`, the last
-- class holding all longer ones). A gap of class k that contains [start, end) ends at or after `end` and, being
-- shorter than 2^(k+1) seconds, before start + 2^(k+1) seconds: one bounded range of that class's index, its start
-- checked on each entry. A gap of class k that only lies in that range without containing the window starts after
-- `start` and ends before start + 2^(k+1) seconds; each atom has at most a couple of those per class, so a class reads
-- at most about one entry per atom beyond what it finds (not every gap of the pool, as the walk by end may). Classes
-- shorter than the window hold no gap that contains it: reading starts at the class of the window's own length less
-- one, a class of slack so that a rounding of the logarithm at a power of two costs nothing.
-- The shorter classes come first: the gaps that contain the window and last the least, tight fits in time.
--
-- Timed in `psql` on the kept fleet of `bench fleet --generate-only` (1,000 nodes of 8 GPUs, every atom booked
-- somewhere in the next 30 days), 168 windows each, generic plans, interleaved with the reads they replace:
-- * 512 gaps of the first round, the same window 200 times: 1.0 to 1.2 ms, now 0.14 to 0.15 ms;
-- * the containment read of at most 1,024 gaps, windows of an hour a week ahead: 1.39 ms, now 0.54; of every gap,
--   2.37 and 1.00 ms; a day-long window, 1.34 and 0.48 ms; windows starting now (512), 0.63 and 0.34 ms. Every
--   window named the same atoms both ways.
-- The GiST index is dropped: nothing else reads it, and every booking and cancel edited its entries.

-- The length class of a bounded gap: floor(log2(seconds)), at least 0, at most 40 (2^40 seconds is over 30,000
-- years, so the last class's reads are bounded by nothing but the window's end).
CREATE FUNCTION gap_length_class(p_gap tstzrange) RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN least(40, floor(ln(greatest(extract(epoch FROM upper(p_gap) - lower(p_gap))::float8, 1)) / ln(2))::integer);

CREATE INDEX atom_gaps_bounded_by_length
    ON atom_gaps (pool_id, class, gap_length_class(gap), upper(gap), lower(gap), node_id, device_id) INCLUDE (gap)
    WHERE NOT lower_inf(gap) AND NOT upper_inf(gap);

CREATE INDEX atom_gaps_bounded_by_end_covering
    ON atom_gaps (pool_id, class, upper(gap), lower(gap), node_id, device_id) INCLUDE (gap)
    WHERE NOT lower_inf(gap) AND NOT upper_inf(gap);
DROP INDEX atom_gaps_bounded_by_end;
DROP INDEX atom_gaps_bounded;

-- As in capacity/0014, the bounded gaps that contain the window read class by class (see above). The bound of each
-- class adds a second of slack to 2^(k+1) seconds, for the same rounding.
CREATE OR REPLACE FUNCTION free_atoms_over(p_pool text, p_class text, p_start timestamptz, p_end timestamptz,
                                           p_limit bigint)
RETURNS TABLE (node_id text, device_id text, part integer)
LANGUAGE sql
STABLE
AS $$
    (SELECT g.node_id, g.device_id, 1 FROM atom_gaps AS g
     WHERE g.pool_id = p_pool AND g.class = p_class AND lower_inf(g.gap)
       AND coalesce(upper(g.gap), 'infinity'::timestamptz) >= p_end
     ORDER BY coalesce(upper(g.gap), 'infinity'::timestamptz), g.node_id, g.device_id
     LIMIT p_limit)
    UNION ALL
    (SELECT g.node_id, g.device_id, 2 FROM atom_gaps AS g
     WHERE g.pool_id = p_pool AND g.class = p_class AND upper_inf(g.gap) AND NOT lower_inf(g.gap)
       AND lower(g.gap) <= p_start
     ORDER BY lower(g.gap) DESC, g.node_id, g.device_id
     LIMIT p_limit)
    UNION ALL
    (SELECT x.node_id, x.device_id, 3
     FROM generate_series(greatest(0, gap_length_class(tstzrange(p_start, p_end)) - 1), 40) AS k(k)
     CROSS JOIN LATERAL (
         SELECT g.node_id, g.device_id FROM atom_gaps AS g
         WHERE g.pool_id = p_pool AND g.class = p_class AND NOT lower_inf(g.gap) AND NOT upper_inf(g.gap)
           AND gap_length_class(g.gap) = k.k
           AND upper(g.gap) >= p_end
           AND upper(g.gap) <= CASE WHEN k.k >= 40 THEN 'infinity'::timestamptz
                                    ELSE p_start + make_interval(secs => 2.0 ^ (k.k + 1) + 1) END
           AND lower(g.gap) <= p_start
         ORDER BY upper(g.gap), lower(g.gap), g.node_id, g.device_id
         LIMIT p_limit) AS x
     LIMIT p_limit)
$$;
