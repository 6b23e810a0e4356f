-- wrk script for bench/run: POST the body file $BENCH_BODY as JSON; on exit write the summary and
-- latency percentiles (µs) as JSON to $BENCH_OUT. No per-response callback, so wrk stays cheap.
-- Optional: $BENCH_HEADER "name=value" adds one request header; $BENCH_RECONNECT N > 0 sends
-- `connection: close` on every Nth request, so Envoy closes and wrk opens a fresh connection.
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
local extra = os.getenv("BENCH_HEADER") or ""
if extra ~= "" then
  local k, v = extra:match("^([^=]+)=(.*)$")
  wrk.headers[k] = v
end

local every = tonumber(os.getenv("BENCH_RECONNECT") or "") or 0
if every > 0 then
  local n, keep, close = 0, nil, nil
  -- Built on first use: wrk sets the Host header after the script has loaded.
  function request()
    if not keep then
      keep = wrk.format()
      wrk.headers["Connection"] = "close"
      close = wrk.format()
      wrk.headers["Connection"] = nil
    end
    n = n + 1
    if n % every == 0 then return close end
    return keep
  end
end

function done(summary, latency, requests)
  local out = assert(io.open(os.getenv("BENCH_OUT"), "w"))
  local e = summary.errors
  out:write(string.format(
    '{"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency":{"min":%d,"max":%d,"mean":%.1f,"stdev":%.1f,"p50":%d,"p90":%d,"p99":%d,"p999":%d}}',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9)))
  out:close()
end
