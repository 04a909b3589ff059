#!/usr/bin/env bash
# The prometheus plugin's cost and its scrape time (issue 13's targets):
#   1. proxy req/s with prometheus in a global rule vs the same gateway without it (>= 0.97x):
#      two instances on one pinned core, wrk and the nginx upstream (1 KiB) on the other, runs
#      alternating so that drift affects both alike;
#   2. the time of one scrape with 1,000 routes that all served requests and 100 health-checked
#      upstream nodes (<= 20 ms), median and worst of 20 scrapes.
#
#   benches/prometheus.sh         # needs: wrk, nginx, curl, python3
#   DURATION=10 ROUNDS=3 CONNS=16 benches/prometheus.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-prometheus.XXXXXX)
chmod 755 "$WORK"
UP_PORT=18380
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx curl python3; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"

# start NAME NODE_PORT CTL_PORT METRICS_PORT RESOURCES: a gateway on PROXY_CPU, waited for.
start() {
  local dir="$WORK/$1"
  mkdir -p "$dir/conf"
  printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  ssl: {enable: false}\n  worker_processes: 1\n  control: {port: %s}\nplugin_attr:\n  prometheus:\n    export_addr: {ip: 127.0.0.1, port: %s}\n' \
    "$2" "$3" "$4" > "$dir/conf/config.yaml"
  printf '%s' "$5" > "$dir/conf/resources.yaml"
  taskset -c "$PROXY_CPU" "$BIN" -p "$dir" > "$dir/weir.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do curl -s -o /dev/null "127.0.0.1:$3/v1/schema" && return 0; sleep 0.1; done
  tail "$dir/weir.log"; exit 1
}

route="routes:\n  - {id: 1, uri: /x, upstream: {nodes: {\"127.0.0.1:$UP_PORT\": 1}}}\n"
start plain 18381 18382 18383 "$(printf "$route")"
start prom 18384 18385 18386 "$(printf "global_rules:\n  - {id: m, plugins: {prometheus: {}}}\n$route")"

run() { wrk_rps "http://127.0.0.1:$1/x"; }
declare -a A B
for i in $(seq 1 "$ROUNDS"); do
  A+=("$(run 18381)"); B+=("$(run 18384)")
  echo "round $i: without ${A[-1]} req/s, with prometheus ${B[-1]} req/s"
done
ma=$(median "${A[@]}"); mb=$(median "${B[@]}")
recorded=$(curl -s 127.0.0.1:18386/weir/prometheus/metrics | awk '/^weir_http_status\{code="200",route="1"/ {print $2}')
echo "prometheus in a global rule vs without: ${mb} vs ${ma} req/s = $(awk -v a="$mb" -v b="$ma" 'BEGIN {printf "%.2f", a/b}')x (target >= 0.97x); requests counted: $recorded"

# Scrape time: 1,000 routes over 10 upstreams of 10 health-checked nodes each (one serving, nine
# at weight 0 on closed ports, so the checker reports all 100), every route requested once.
python3 - "$UP_PORT" > "$WORK/big.yaml" <<'PY'
import sys
up = sys.argv[1]
print("upstreams:")
for u in range(10):
    nodes = ", ".join([f'"127.0.0.1:{up}": 1'] + [f'"127.0.0.{u + 2}:{19000 + n}": 0' for n in range(9)])
    print(f"  - {{id: u{u}, nodes: {{{nodes}}}, checks: {{active: {{type: tcp, timeout: 0.2, healthy: {{interval: 2}}, unhealthy: {{interval: 2}}}}}}}}")
print("global_rules:\n  - {id: m, plugins: {prometheus: {}}}")
print("routes:")
for r in range(1000):
    print(f"  - {{id: r{r}, uri: /r/{r}, hosts: [\"h{r % 7}.example.com\"], upstream_id: u{r % 10}}}")
PY
start big 18387 18388 18389 "$(cat "$WORK/big.yaml")"
python3 - <<'PY'
import http.client
c = http.client.HTTPConnection("127.0.0.1", 18387)
for r in range(1000):
    c.request("GET", f"/r/{r}", headers={"Host": f"h{r % 7}.example.com"})
    resp = c.getresponse(); resp.read()
    assert resp.status == 200, (r, resp.status)
PY
sleep 3   # the checkers probe every node
metrics=$(curl -s 127.0.0.1:18389/weir/prometheus/metrics)
series=$(echo "$metrics" | grep -c '^weir_http_status{')
nodes=$(echo "$metrics" | grep -c '^weir_upstream_status{')
declare -a T
for _ in $(seq 1 20); do T+=("$(curl -s -o /dev/null -w '%{time_total}' 127.0.0.1:18389/weir/prometheus/metrics)"); done
worst=$(printf '%s\n' "${T[@]}" | sort -n | tail -n 1)
echo "scrape with 1,000 routes ($series http_status series) and $nodes upstream nodes: median $(awk -v t="$(median "${T[@]}")" 'BEGIN {printf "%.1f", t*1000}') ms, worst $(awk -v t="$worst" 'BEGIN {printf "%.1f", t*1000}') ms, $(echo "$metrics" | wc -c) bytes (target <= 20 ms)"
