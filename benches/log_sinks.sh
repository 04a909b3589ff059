#!/usr/bin/env bash
# http-logger with a log server that stalls (issue 26's target): a sink that accepts each
# connection and then neither reads nor answers for STALL seconds. Measured against the same
# gateway without a logger: req/s and p99 latency (wrk --latency, medians of ROUNDS runs
# alternating between the two), and the logger's RSS at start, after each run and at the end
# (bounded: the batch processor holds at most max_pending_entries / max_pending_bytes). Both
# gateways on one pinned core, wrk and the nginx upstream (1 KiB) on the other; loopback only.
#
#   benches/log_sinks.sh        # needs: wrk, nginx, curl, python3
#   DURATION=10 ROUNDS=3 CONNS=16 STALL=60 benches/log_sinks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
STALL=${STALL:-60}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-logsinks.XXXXXX)
chmod 755 "$WORK"
UP_PORT=19380
SINK_PORT=19381
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx curl python3; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"

# The stalled log server: accepts, reads nothing, answers nothing, closes after STALL seconds.
python3 - "$SINK_PORT" "$STALL" <<'PY' &
import socket, sys, threading, time
port, stall = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port)); s.listen(1024)
def hold(c):
    time.sleep(stall); c.close()
end = time.time() + 3600
while time.time() < end:
    c, _ = s.accept()
    threading.Thread(target=hold, args=(c,), daemon=True).start()
PY
PIDS+=($!)

# start NAME NODE_PORT CTL_PORT RESOURCES: a gateway on PROXY_CPU, waited for; its pid in $LAST.
start() {
  local dir="$WORK/$1"
  mkdir -p "$dir/conf"
  printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  ssl: {enable: false}\n  worker_processes: 1\n  control: {port: %s}\nplugin_attr:\n  prometheus:\n    export_addr: {ip: 127.0.0.1, port: %s}\n' \
    "$2" "$3" "$(( $3 + 100 ))" > "$dir/conf/config.yaml"
  printf '%s' "$4" > "$dir/conf/resources.yaml"
  taskset -c "$PROXY_CPU" "$BIN" -p "$dir" > "$dir/weir.log" 2>&1 &
  LAST=$!
  PIDS+=("$LAST")
  for _ in $(seq 1 100); do curl -s -o /dev/null "127.0.0.1:$3/v1/schema" && return 0; sleep 0.1; done
  tail "$dir/weir.log"; exit 1
}
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

route="  - {id: 1, uri: /x, upstream: {nodes: {\"127.0.0.1:$UP_PORT\": 1}}%s}\n"
start plain 19382 19383 "$(printf "routes:\n$route" "")"
start logger 19384 19385 "$(printf "routes:\n$route" ", plugins: {http-logger: {uri: \"http://127.0.0.1:$SINK_PORT/logs\", timeout: $STALL}}")"
LOGGER=$LAST
echo "logger RSS at start: $(rss "$LOGGER") KiB"

# run PORT: "req/s p99_ms" of one wrk run.
run() {
  local out; out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$1/x")
  if echo "$out" | grep -qE 'Non-2xx|Socket errors'; then echo "$out" >&2; fi
  local rps p99
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1 == "99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}')
  echo "$rps $p99"
}
declare -a RA RB PA PB
for i in $(seq 1 "$ROUNDS"); do
  read -r r p < <(run 19382); RA+=("$r"); PA+=("$p")
  read -r r p < <(run 19384); RB+=("$r"); PB+=("$p")
  echo "round $i: without a logger ${RA[-1]} req/s p99 ${PA[-1]} ms; http-logger to a stalled sink ${RB[-1]} req/s p99 ${PB[-1]} ms; logger RSS $(rss "$LOGGER") KiB"
done
metrics=$(curl -s "127.0.0.1:$(( 19385 + 100 ))/weir/prometheus/metrics")
dropped=$(echo "$metrics" | awk '/^weir_log_sink_dropped_total\{.*reason="full"/ {print $2}')
pending=$(echo "$metrics" | awk '/^weir_log_sink_pending_entries\{/ {print $2}')
pbytes=$(echo "$metrics" | awk '/^weir_log_sink_pending_bytes\{/ {print $2}')
ra=$(median "${RA[@]}"); rb=$(median "${RB[@]}"); pa=$(median "${PA[@]}"); pb=$(median "${PB[@]}")
echo "http-logger to a sink stalled ${STALL}s vs no logger: ${rb} vs ${ra} req/s = $(awk -v a="$rb" -v b="$ra" 'BEGIN {printf "%.2f", a/b}')x; p99 ${pb} vs ${pa} ms"
echo "logger RSS at the end: $(rss "$LOGGER") KiB; entries held ${pending} (${pbytes} bytes; bound 8192 entries / 16 MiB), dropped ${dropped}"
