#!/usr/bin/env bash
# Limiters: what limit-req costs, and what a flood of distinct keys costs in memory.
#  1. req/s of a plain route vs limit-req local (target >= 0.95x plain) vs limit-req redis
#     (target >= 0.8x local). The limit is never reached: this measures the cost of counting.
#     Weir on one core (worker_processes 1); wrk, the nginx upstream (1 KiB) and redis-server on
#     the other. Runs alternate (plain, local, redis, plain, ...) so that drift affects all alike.
#  2. RSS of the weir process before and after KEYS (1,000,000) distinct limiter keys (a wrk
#     script sends a new X-Key value with every request) through limit-req local with
#     plugin_attr.limit-req.max_keys = MAX_KEYS (100,000): the store stays at the bound (keys and
#     evictions read from the Prometheus exporter), so RSS grows by the bound's worth, not the
#     flood's.
#
#   benches/limiters.sh        # needs: wrk, nginx, redis-server (apt-get install wrk nginx-light redis-server)
#   DURATION=10 ROUNDS=3 CONNS=16 KEYS=1000000 MAX_KEYS=100000 benches/limiters.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
KEYS=${KEYS:-1000000}
MAX_KEYS=${MAX_KEYS:-100000}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-limiters.XXXXXX)
chmod 755 "$WORK"
UP_PORT=18380; REDIS_PORT=18381; WEIR_PORT=18382; CTL_PORT=18383; METRICS_PORT=18384
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx redis-server redis-cli; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT

mkdir -p "$WORK/weir/conf"
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"
taskset -c "$LOAD_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" > "$WORK/redis.log" 2>&1 &
PIDS+=($!)

cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  ssl: {enable: false}
  worker_processes: 1
  control: {port: $CTL_PORT}
plugin_attr:
  limit-req: {max_keys: $MAX_KEYS}
  prometheus:
    export_addr: {ip: 127.0.0.1, port: $METRICS_PORT}
CONF
up="upstream: {nodes: {\"127.0.0.1:$UP_PORT\": 1}}"
never='rate: 1000000000, burst: 1000000000, nodelay: true'
cat > "$WORK/weir/conf/resources.yaml" <<RES
routes:
  - {id: plain, uri: /plain, $up}
  - {id: local, uri: /local, $up, plugins: {limit-req: {$never, key: remote_addr}}}
  - {id: redis, uri: /redis, $up, plugins: {limit-req: {$never, key: remote_addr, policy: redis, redis_host: 127.0.0.1, redis_port: $REDIS_PORT}}}
  - {id: keys, uri: /keys, $up, plugins: {limit-req: {$never, key: http_x_key}}}
RES
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
PIDS+=("$WEIR_PID")
for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$WEIR_PORT/redis")" = 200 ] && break
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$WEIR_PORT/redis")" = 200 ] || { tail "$WORK/weir.log"; exit 1; }

# --- 1. req/s -----------------------------------------------------------------------------------
run() { wrk_rps "http://127.0.0.1:$WEIR_PORT/$1"; }
declare -a P L R
for i in $(seq 1 "$ROUNDS"); do
  P+=("$(run plain)"); L+=("$(run local)"); R+=("$(run redis)")
  echo "round $i: plain ${P[-1]} req/s, limit-req local ${L[-1]} req/s, limit-req redis ${R[-1]} req/s"
done
mp=$(median "${P[@]}"); ml=$(median "${L[@]}"); mr=$(median "${R[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }

# --- 2. RSS under a flood of distinct keys ------------------------------------------------------
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$WEIR_PID/status"; }
sample() { curl -s "127.0.0.1:$METRICS_PORT/weir/prometheus/metrics" | awk -v s="$1" 'index($0, s) == 1 {print $2}'; }
cat > "$WORK/keys.lua" <<'LUA'
-- A new X-Key with every request (one wrk thread: the counter is unique).
local sent = 0
request = function()
  sent = sent + 1
  return wrk.format("GET", "/keys", {["X-Key"] = "flood-" .. sent})
end
LUA
curl -s -o /dev/null "127.0.0.1:$WEIR_PORT/keys" -H 'X-Key: warm'
before=$(rss_kib)
started=$(date +%s.%N)
taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d3600s -s "$WORK/keys.lua" "http://127.0.0.1:$WEIR_PORT" > "$WORK/flood.txt" &
FLOOD=$!
PIDS+=("$FLOOD")
# Until the store has seen KEYS distinct keys (held + evicted), then stop the flood.
while :; do
  seen=$(awk -v a="$(sample 'weir_limiter_keys{plugin="limit-req"}')" -v b="$(sample 'weir_limiter_evictions_total{plugin="limit-req"}')" 'BEGIN {print a + b}')
  [ "${seen%.*}" -ge "$KEYS" ] && break
  sleep 0.2
done
kill "$FLOOD"; wait "$FLOOD" 2>/dev/null || true
took=$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
sleep 1
after=$(rss_kib)
keys=$(sample 'weir_limiter_keys{plugin="limit-req"}')
evicted=$(sample 'weir_limiter_evictions_total{plugin="limit-req"}')
sent=$(awk -v a="$keys" -v b="$evicted" 'BEGIN {print a + b}')

echo
echo "limit-req local vs plain:  ${ml} vs ${mp} req/s = $(ratio "$ml" "$mp")x (target >= 0.95x)"
echo "limit-req redis vs local:  ${mr} vs ${ml} req/s = $(ratio "$mr" "$ml")x (target >= 0.8x)"
echo "flood: $sent distinct keys in ${took}s; store: $keys keys (max_keys $MAX_KEYS), $evicted evicted"
echo "weir RSS: $((before / 1024)) MiB before, $((after / 1024)) MiB after (+$(((after - before) / 1024)) MiB;" \
  "$(awk -v a="$after" -v b="$before" -v k="$keys" 'BEGIN {if (k > 0) printf "%.0f", (a - b) * 1024 / k; else print "?"}') bytes per key held)"
