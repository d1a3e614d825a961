-- GPU utilization as the agents sample it (NVML's utilization rate, 0 to 100) and send it with their heartbeats:
-- runtime rows, never events, summed per node, GPU and UTC hour (`hour_ms`, epoch milliseconds of the hour's
-- start, by the database's clock when the heartbeat arrived). The GPU-hour ledger shows the mean of the hours a
-- reservation held a GPU bound.
CREATE TABLE gpu_utilization (
    node_id text NOT NULL,
    gpu text NOT NULL,
    hour_ms bigint NOT NULL,
    percent_sum bigint NOT NULL CHECK (percent_sum >= 0),
    samples integer NOT NULL CHECK (samples > 0),
    -- A node's hour first: the ledger looks up the hours of the nodes a tenant's reservations held.
    PRIMARY KEY (node_id, hour_ms, gpu)
);

-- One heartbeat's samples, one per GPU (each GPU once), added to the current UTC hour's rows in one statement.
CREATE FUNCTION record_gpu_utilization(p_node_id text, p_gpus text[], p_percents int4[])
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO gpu_utilization AS u (node_id, gpu, hour_ms, percent_sum, samples)
    SELECT p_node_id, s.gpu, ts_ms(compute_now()) / 3600000 * 3600000, s.percent, 1
    FROM unnest(p_gpus, p_percents) AS s(gpu, percent)
    ON CONFLICT (node_id, hour_ms, gpu) DO UPDATE
        SET percent_sum = u.percent_sum + excluded.percent_sum, samples = u.samples + 1
$$;
