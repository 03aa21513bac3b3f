-- Printed by wrk once the run is over: one machine-readable line the bench parses.
-- Latency percentiles are in microseconds, as wrk keeps them.
done = function(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    "BENCH_WRK {\"requests\": %d, \"duration_us\": %d, \"bytes\": %d, " ..
    "\"connect_errors\": %d, \"read_errors\": %d, \"write_errors\": %d, " ..
    "\"status_errors\": %d, \"timeouts\": %d, " ..
    "\"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"max_us\": %d, \"mean_us\": %.1f}\n",
    summary.requests, summary.duration, summary.bytes,
    errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
