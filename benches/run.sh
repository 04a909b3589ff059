#!/usr/bin/env bash
# Every benchmark of the performance issue, side by side with nginx, in one table.
# Builds the release binary once, then runs:
#   - user-space instructions per proxied request (callgrind; stable on a noisy VM): plain, and
#     key-auth + limit-count + proxy-rewrite         ../shared/tools/instr_per_request.sh
#   - req/s and latency vs nginx proxy_pass, 10 vs 10,000 routes, RSS   benches/proxy.sh
#   - RSS per idle keep-alive connection vs nginx    benches/idle_conns.sh
#   - short-url creation and redirects (SQLite; PostgreSQL when PG_URL is set)   benches/short_url.sh
#   - short-url visits on/off, list p99 over 1M links (SQLite)                    benches/short_url_manage.sh
#   - HTTPS keep-alive, full TLS handshakes/s and HTTP/2 (h2load) vs nginx   benches/tls.sh
#   - the TCP stream proxy vs nginx stream: MB/s, connections/s, RSS per idle connection   benches/stream.sh
#   - the stream proxy's user-space instructions per TCP connection vs nginx stream (callgrind)
#     benches/instr_per_stream_conn.sh
#   - the same per HTTP/2 request (h2c, h2load) vs nginx   benches/instr_per_h2_request.sh
#   - cluster mode (when etcd is installed): cold start, route changes under load, Admin API
#     writes and propagation   benches/cluster.sh
#   - one route change among 10,000, in process   cargo bench --bench snapshot_churn
#   - limit-count policy redis vs local (when redis-server is installed)   benches/limit_redis.sh
#   - the prometheus plugin in a global rule vs without, and scrape time with 1,000 routes and
#     100 upstream nodes   benches/prometheus.sh
#   - every auth plugin alone vs key-auth: instructions per request and req/s   benches/auth.sh
#   - the traffic plugins (traffic-split with vars, api-breaker, fault-injection) vs a plain
#     route: instructions per request   benches/traffic.sh
#   - limit-req local and redis vs plain, RSS with 1,000,000 limiter keys   benches/limiters.sh
#   - proxy-cache HIT (memory, disk) vs the proxied path vs nginx proxy_cache   benches/cache.sh
#   - gzip and brotli of a 100 KiB JSON body vs nginx gzip   benches/compression.sh
#   - each default plugin alone on a route: instructions per request   benches/plugin_cost.sh
#   - 30-minute soak: RSS plateau, descriptors, p99 under churn   benches/soak.sh (SOAK=1)
#   - http-logger to a log server that stalls for 60 s vs no logger: req/s, p99, RSS   benches/log_sinks.sh
#   - two zero-downtime upgrades (SIGUSR2) under wrk: failed requests, old process exit   benches/upgrade.sh
#   - HTTP/3 vs HTTP/2, Weir vs Caddy: req/s, p99, server CPU per request   benches/http3.sh
#
#   benches/run.sh        # needs wrk, nginx, valgrind; DURATION, ROUNDS, STORED as the scripts take;
#                         # RUN_OUT=DIR keeps the scripts' outputs
#   PGO=1 benches/run.sh  # every figure for the profile-guided build (benches/pgo.sh makes it)
set -euo pipefail
cd "$(dirname "$0")/.."
export DURATION=${DURATION:-8} ROUNDS=${ROUNDS:-3} STORED=${STORED:-100000}
cargo build --release -q
if [ -n "${PGO:-}" ]; then
  benches/pgo.sh
  export BIN=$PWD/target/pgo-use/release/weir WEIR_BIN=$PWD/target/pgo-use/release/weir
fi
# RUN_OUT=DIR keeps every benchmark's full output in DIR (the summary below is an excerpt).
if [ -n "${RUN_OUT:-}" ]; then out=$RUN_OUT; mkdir -p "$out"; else out=$(mktemp -d /tmp/weir-run.XXXXXX); trap 'rm -rf "$out"' EXIT; fi
ipr=../shared/tools/instr_per_request.sh
plugins='{"key-auth": {}, "limit-count": {"count": 1000000000, "time_window": 60}, "proxy-rewrite": {"headers": {"set": {"x-a": "b"}}}}'
if [ -x "$ipr" ] && command -v valgrind >/dev/null; then
  "$ipr" > "$out/ipr-plain" 2>&1 || true
  "$ipr" "$plugins" > "$out/ipr-plugins" 2>&1 || true
  benches/instr_per_stream_conn.sh > "$out/ipc-stream" 2>&1 || true
  command -v h2load >/dev/null && { benches/instr_per_h2_request.sh > "$out/ipr-h2" 2>&1 || true; }
fi
benches/proxy.sh > "$out/proxy" 2>&1 || true
benches/idle_conns.sh > "$out/idle" 2>&1 || true
benches/short_url.sh > "$out/su-sqlite" 2>&1 || true
benches/short_url_manage.sh > "$out/su-manage" 2>&1 || true
benches/tls.sh > "$out/tls" 2>&1 || true
benches/stream.sh > "$out/stream" 2>&1 || true
if command -v etcd >/dev/null; then benches/cluster.sh > "$out/cluster" 2>&1 || true; fi
cargo bench --bench snapshot_churn > "$out/snapshot_churn" 2>&1 || true
if command -v redis-server >/dev/null; then benches/limit_redis.sh > "$out/redis" 2>&1 || true; fi
benches/prometheus.sh > "$out/prometheus" 2>&1 || true
benches/auth.sh > "$out/auth" 2>&1 || true
benches/traffic.sh > "$out/traffic" 2>&1 || true
if command -v redis-server >/dev/null; then benches/limiters.sh > "$out/limiters" 2>&1 || true; fi
benches/cache.sh > "$out/cache" 2>&1 || true
benches/compression.sh > "$out/compression" 2>&1 || true
benches/plugin_cost.sh > "$out/plugin_cost" 2>&1 || true
if [ "${SOAK:-0}" = 1 ]; then benches/soak.sh > "$out/soak" 2>&1 || true; fi
benches/log_sinks.sh > "$out/log_sinks" 2>&1 || true
benches/upgrade.sh > "$out/upgrade" 2>&1 || true
if command -v caddy >/dev/null; then benches/http3.sh > "$out/http3" 2>&1 || true; fi
if [ -n "${PG_URL:-}" ]; then BACKEND=postgres benches/short_url.sh > "$out/su-pg" 2>&1 || true; fi

echo
echo "=== instructions per proxied request (callgrind) ==="
grep -h "instructions per request" "$out"/ipr-* 2>/dev/null | sed 's/^/  /' || echo "  (valgrind or the tool not available)"
grep -h "instructions per connection" "$out"/ipc-stream 2>/dev/null | sed 's/^/  stream: /' || true
echo "=== proxy (wrk, medians of $ROUNDS rounds) ==="
sed -n '/^median of/,$p' "$out/proxy" | sed 's/^/  /'
echo "=== idle connections ==="
sed 's/^/  /' "$out/idle" | tail -n 1
echo "=== short-url, SQLite ==="
grep -E "create|redirect|stored" "$out/su-sqlite" | sed 's/^/  /'
echo "=== short-url visits and management, SQLite ==="
grep -E "create|redirect|list|stored|visits" "$out/su-manage" | sed 's/^/  /'
echo "=== TLS and HTTP/2 (medians of $ROUNDS rounds) ==="
sed -n '/^scenario/,$p' "$out/tls" | sed 's/^/  /'
echo "=== TCP stream proxy (medians of $ROUNDS rounds) ==="
sed -n '/^scenario/,$p' "$out/stream" | sed 's/^/  /'
if [ -f "$out/cluster" ]; then
  echo "=== cluster (three instances, one etcd) ==="
  grep -E "^(cold start|propagation|route change|proxy load|Admin API write)" "$out/cluster" | sed 's/^/  /'
fi
echo "=== one route change among 10,000, in process ==="
grep -E "routes|validation" "$out/snapshot_churn" | sed 's/^/  /'
if [ -f "$out/redis" ]; then
  echo "=== shared rate limits (limit-count, medians of $ROUNDS rounds) ==="
  grep -E "^limit-count" "$out/redis" | sed 's/^/  /'
fi
echo "=== prometheus plugin (medians of $ROUNDS rounds) ==="
grep -E "^(prometheus|scrape)" "$out/prometheus" | sed 's/^/  /'
echo "=== auth plugins (instructions per request; wrk medians of $ROUNDS rounds vs key-auth) ==="
grep -E "^\|" "$out/auth" | sed 's/^/  /'
echo "=== traffic plugins (instructions per request) ==="
tail -n 8 "$out/traffic" | sed 's/^/  /'
if [ -f "$out/limiters" ]; then
  echo "=== limiters ==="
  tail -n 8 "$out/limiters" | sed 's/^/  /'
fi
echo "=== proxy-cache ==="
tail -n 6 "$out/cache" | sed 's/^/  /'
echo "=== compression ==="
grep -E "^(100 KiB|gzip level)" "$out/compression" | sed 's/^/  /'
echo "=== log sinks (http-logger to a stalled sink, medians of $ROUNDS rounds) ==="
grep -E "^(http-logger|logger RSS at the end)" "$out/log_sinks" | sed 's/^/  /'
if [ -f "$out/su-pg" ]; then
  echo "=== short-url, PostgreSQL ==="
  grep -E "create|redirect|stored" "$out/su-pg" | sed 's/^/  /'
fi
echo "=== each plugin alone on a route (instructions per request) ==="
grep -E "^\|" "$out/plugin_cost" | sed 's/^/  /'
if [ -f "$out/soak" ]; then
  echo "=== soak ==="
  tail -n 6 "$out/soak" | sed 's/^/  /'
fi
echo "=== zero-downtime upgrades under wrk ==="
grep -E "^upgrade [0-9]|failed requests" "$out/upgrade" | sed 's/^/  /'
if [ -f "$out/http3" ]; then
  echo "=== HTTP/3 and HTTP/2, Weir and Caddy ==="
  grep -E " h[23] " "$out/http3" | sed 's/^/  /'
fi
