#!/usr/bin/env bash
# The opentelemetry plugin's cost (issue 26's targets):
#   1. proxy req/s with opentelemetry `always_on` and its OTLP/HTTP exporter running (a local
#      receiver answering every export) vs the same route without the plugin (>= 0.9x), and with
#      `trace_id_ratio: 0.01` (>= 0.98x): three instances on one pinned core, wrk, the nginx
#      upstream (1 KiB) and the receiver on the other, runs alternating so that drift affects
#      all alike; the spans exported and dropped are read from the exporter's counters;
#   2. user-space instructions per request of each (../shared/tools/instr_per_request.sh,
#      callgrind, every thread of the process counted: the exporter's too), with a receiver on
#      the collector's default address (127.0.0.1:4318) when that port is free.
#
#   benches/otel.sh               # needs: wrk, nginx, curl, python3 (valgrind for part 2)
#   DURATION=10 ROUNDS=3 CONNS=16 INSTR=0 benches/otel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
INSTR=${INSTR:-1}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-otel.XXXXXX)
chmod 755 "$WORK"
UP_PORT=18480
RECV_PORT=18490
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx curl python3; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"

# receiver PORT: an OTLP/HTTP receiver (keep-alive HTTP/1.1) answering 200 to every export and
# counting the bytes it received, on LOAD_CPU.
receiver() {
  taskset -c "$LOAD_CPU" python3 - "$1" > "$WORK/receiver-$1.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
  PIDS+=($!)
}
receiver "$RECV_PORT"

# start NAME NODE_PORT CTL_PORT METRICS_PORT PLUGINS: a gateway on PROXY_CPU, waited for.
start() {
  local dir="$WORK/$1"
  mkdir -p "$dir/conf"
  printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  ssl: {enable: false}\n  worker_processes: 1\n  control: {port: %s}\nplugin_attr:\n  prometheus:\n    export_addr: {ip: 127.0.0.1, port: %s}\n  opentelemetry:\n    collector: {address: "127.0.0.1:%s"}\n' \
    "$2" "$3" "$4" "$RECV_PORT" > "$dir/conf/config.yaml"
  printf 'routes:\n  - {id: 1, uri: /x, plugins: %s, upstream: {nodes: {"127.0.0.1:%s": 1}}}\n' "$5" "$UP_PORT" > "$dir/conf/resources.yaml"
  taskset -c "$PROXY_CPU" "$BIN" -p "$dir" > "$dir/weir.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do curl -s -o /dev/null "127.0.0.1:$3/v1/schema" && return 0; sleep 0.1; done
  tail "$dir/weir.log"; exit 1
}

start off 18481 18482 18483 '{}'
start on 18484 18485 18486 '{opentelemetry: {sampler: {name: always_on}}}'
start ratio 18487 18488 18489 '{opentelemetry: {sampler: {name: trace_id_ratio, options: {fraction: 0.01}}}}'

run() { wrk_rps "http://127.0.0.1:$1/x"; }
declare -a A B C
for i in $(seq 1 "$ROUNDS"); do
  # Each round starts with another instance, so that the order favours none of them.
  case $((i % 3)) in
    1) A+=("$(run 18481)"); B+=("$(run 18484)"); C+=("$(run 18487)") ;;
    2) B+=("$(run 18484)"); C+=("$(run 18487)"); A+=("$(run 18481)") ;;
    0) C+=("$(run 18487)"); A+=("$(run 18481)"); B+=("$(run 18484)") ;;
  esac
  echo "round $i: off ${A[-1]} req/s, always_on ${B[-1]} req/s, trace_id_ratio 0.01 ${C[-1]} req/s"
done
sleep 3 # the last batches go out
counter() { curl -s "127.0.0.1:$1/weir/prometheus/metrics" | awk -v m="weir_opentelemetry_$2" '$1 == m {print $2}'; }
ma=$(median "${A[@]}"); mb=$(median "${B[@]}"); mc=$(median "${C[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a/b}'; }
echo "always_on with the OTLP exporter vs off: ${mb} vs ${ma} req/s = $(ratio "$mb" "$ma")x (target >= 0.9x); spans exported $(counter 18486 spans_exported_total), dropped $(counter 18486 spans_dropped_total), failed $(counter 18486 spans_failed_total)"
echo "trace_id_ratio 0.01 vs off: ${mc} vs ${ma} req/s = $(ratio "$mc" "$ma")x (target >= 0.98x); spans exported $(counter 18489 spans_exported_total), dropped $(counter 18489 spans_dropped_total)"

[ "$INSTR" = 1 ] || exit 0
TOOL=${TOOL:-../shared/tools/instr_per_request.sh}
[ -x "$TOOL" ] || TOOL=/work/shared/tools/instr_per_request.sh
command -v valgrind >/dev/null || { echo "valgrind is required for instructions per request"; exit 1; }
# The tool's gateway exports to the default collector address: answer there when it is free.
if ! python3 -c 'import socket;socket.create_connection(("127.0.0.1",4318),0.2)' 2>/dev/null; then receiver 4318; sleep 0.5; fi
for plugins in '{}' '{"opentelemetry": {"sampler": {"name": "always_on"}}}' \
  '{"opentelemetry": {"sampler": {"name": "trace_id_ratio", "options": {"fraction": 0.01}}}}'; do
  echo "$plugins: $(WEIR_BIN="$BIN" "$TOOL" "$plugins" | tail -n 1)"
done
