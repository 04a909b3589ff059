#!/usr/bin/env bash
# Soak: Weir under everything that makes a long-running gateway grow, for DURATION seconds
# (default 1800), then a verdict. At once:
#   - keep-alive load with 100,000 distinct limit-count keys (limit-count keyed by a header);
#   - connection churn (a second wrk sending `Connection: close`);
#   - route churn: resources.yaml rewritten 10 times a second, each time with a new route id
#     (new Prometheus label sets, new plugin instances, a new snapshot);
#   - an access log whose reader stalls (a FIFO opened and never read: the writer blocks, lines
#     are dropped and counted).
# Every SAMPLE seconds: RSS, open descriptors, and the p99 of the load's last segment.
# Verdict: RSS growth over the second half < MAX_GROWTH % (default 2), descriptors at the end
# within 32 of the first half's, every segment answered. Exit status 1 otherwise.
#
#   benches/soak.sh                         # 30 minutes (needs wrk, nginx)
#   DURATION=180 benches/soak.sh            # the 3-minute variant .ci/run runs
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-1800}
SAMPLE=${SAMPLE:-10}
MAX_GROWTH=${MAX_GROWTH:-2}
KEYS=${KEYS:-100000}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-soak.XXXXXX)
chmod 755 "$WORK"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
UP_PORT=$(port); WEIR_PORT=$(port); CTL_PORT=$(port); PROM_PORT=$(port)
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done
PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT

nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"
mkdir -p "$WORK/weir/conf" "$WORK/weir/logs"
mkfifo "$WORK/weir/logs/access.log"
# The stalled sink: opened for reading (so the writer can open it), never read.
sleep infinity < "$WORK/weir/logs/access.log" &
PIDS+=($!)
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  ssl: {enable: false}
  worker_processes: 1
  control: {port: $CTL_PORT}
  access_log: {path: logs/access.log, format: combined, buffer: 16384}
plugin_attr:
  prometheus:
    export_addr: {ip: 127.0.0.1, port: $PROM_PORT}
CONF
resources() { # generation
  cat <<RES
global_rules:
  - {id: metrics, plugins: {prometheus: {}}}
routes:
  - {id: keys, uri: /k, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}, plugins: {limit-count: {count: 1000000000, time_window: 3600, key_type: var, key: http_x_key}}}
  - {id: plain, uri: /plain, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}}
  - {id: churn-$1, uri: /churn, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}, plugins: {proxy-rewrite: {headers: {set: {X-Generation: "$1"}}}}}
RES
}
resources 0 > "$WORK/weir/conf/resources.yaml"
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
WEIR=$!
PIDS+=($WEIR)
for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$WEIR_PORT/plain")" = 200 ] && break
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$WEIR_PORT/plain")" = 200 ] || { tail "$WORK/weir.log"; exit 1; }

cat > "$WORK/keys.lua" <<LUA
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/k", { ["X-Key"] = "k" .. (n * 7919 % $KEYS) })
end
LUA
# Route churn: a new route id 10 times a second.
( g=1; while true; do resources "$g" > "$WORK/weir/conf/resources.yaml.tmp"; mv "$WORK/weir/conf/resources.yaml.tmp" "$WORK/weir/conf/resources.yaml"; g=$((g + 1)); sleep 0.1; done ) &
PIDS+=($!)
# Connection churn: a new connection per request, all along.
( while true; do taskset -c "$LOAD_CPU" wrk -t1 -c4 -d60s -H 'Connection: close' "http://127.0.0.1:$WEIR_PORT/plain" >/dev/null 2>&1 || true; done ) &
PIDS+=($!)

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$WEIR/status"; }
fds() { ls "/proc/$WEIR/fd" | wc -l; }
declare -a RSS FDS P99
end=$((SECONDS + DURATION))
echo "sample  rss_kb  fds  p99   req/s"
while [ $SECONDS -lt $end ]; do
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c16 -d"${SAMPLE}s" --latency -s "$WORK/keys.lua" "http://127.0.0.1:$WEIR_PORT/k" 2>&1 || true)
  kill -0 "$WEIR" 2>/dev/null || { echo "weir exited:"; tail "$WORK/weir.log"; exit 1; }
  p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  [ -n "$p99" ] && [ -n "$rps" ] || { echo "a load segment failed:"; echo "$out"; exit 1; }
  RSS+=("$(rss)"); FDS+=("$(fds)"); P99+=("$p99")
  printf '%6d  %6s  %3s  %-6s %s\n' "${#RSS[@]}" "${RSS[-1]}" "${FDS[-1]}" "$p99" "$rps"
done
n=${#RSS[@]}
[ "$n" -ge 4 ] || { echo "too short: $n samples"; exit 1; }
half=$((n / 2))
mid=${RSS[$half]}; last=${RSS[-1]}
# The plateau: the highest RSS of the second half against the RSS at its start.
max2=$(printf '%s\n' "${RSS[@]:$half}" | sort -n | tail -1)
growth=$(awk -v a="$mid" -v b="$max2" 'BEGIN {printf "%.2f", (b - a) * 100 / a}')
fd1=$(printf '%s\n' "${FDS[@]:0:$half}" | sort -n | tail -1)
fd2=${FDS[-1]}
dropped=$(curl -s "127.0.0.1:$PROM_PORT/weir/prometheus/metrics" | awk '/^[a-z_]*access_log_dropped_total/ {print $2}' | head -1)
generations=$(grep -c . "$WORK/weir.log" || true)
echo "RSS: ${RSS[0]} kB at the first sample, $mid kB at half time, $last kB at the end (max of the second half $max2): growth over the second half $growth %"
echo "descriptors: at most $fd1 in the first half, $fd2 at the end"
echo "p99 per segment: first ${P99[0]}, half ${P99[$half]}, last ${P99[-1]}"
echo "access log lines dropped (stalled reader): ${dropped:-?}; log lines written by weir: $generations"
ok=1
awk -v g="$growth" -v m="$MAX_GROWTH" 'BEGIN {exit !(g < m)}' || { echo "FAIL: RSS grew $growth % over the second half (limit $MAX_GROWTH %)"; ok=0; }
[ "$fd2" -le $((fd1 + 32)) ] || { echo "FAIL: descriptors grew from $fd1 to $fd2"; ok=0; }
[ $ok = 1 ] && echo "soak: PASS" || { echo "soak: FAIL"; exit 1; }
