#!/usr/bin/env bash
# Stream (TCP) proxy benchmark: Weir stream_routes vs nginx `stream { proxy_pass }`, each on one
# pinned core (one worker), the load tool and the upstream (nginx serving files over HTTP) on the
# other core. Both proxies only see bytes; wrk supplies them.
#
#   benches/stream.sh          # needs: wrk, nginx with the stream module (apt-get install wrk
#                              #   nginx-light libnginx-mod-stream), python3
#   DURATION=10 ROUNDS=3 benches/stream.sh
#   SCENARIOS=conns benches/stream.sh     # one scenario (the idle figure is always taken)
#
# Scenarios, alternating weir / nginx each round:
#   throughput   one long connection downloading a 64 MiB file over and over: MB/s
#   conns        16 clients, each connection: connect, ~100-byte request, 1 KiB answer, close:
#                connections/s, and the proxy's CPU time per connection (which the load tool's
#                core does not cap)
#   idle         RSS per idle proxied connection (2,000 open through the proxy)
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
SCENARIOS=${SCENARIOS:-throughput conns}
IDLE=${IDLE:-2000}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-stream-bench.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
UP_PORT=18380; NGINX_PORT=18381; WEIR_PORT=18382; WEIR_HTTP=18383; CTL_PORT=18390
STREAM_MODULE=${STREAM_MODULE:-/usr/lib/nginx/modules/ngx_stream_module.so}

[ -x "$BIN" ] || cargo build --release
command -v wrk >/dev/null || { echo "wrk is required"; exit 1; }
[ -f "$STREAM_MODULE" ] || { echo "nginx's stream module is required (apt-get install libnginx-mod-stream)"; exit 1; }
ulimit -n 65536 2>/dev/null || true

cleanup() {
  [ -f "$WORK/up/nginx.pid" ] && kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true
  [ -f "$WORK/peer/nginx.pid" ] && kill "$(cat "$WORK/peer/nginx.pid")" 2>/dev/null || true
  [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/up" "$WORK/peer" "$WORK/weir/conf"
head -c 1024 /dev/zero | tr '\0' 'x' > "$WORK/up/1k"
head -c $((64 << 20)) /dev/zero > "$WORK/up/64m"
cat > "$WORK/up/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/up/nginx.pid;
error_log $WORK/up/error.log;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  sendfile on;
  server { listen 127.0.0.1:$UP_PORT backlog=4096; root $WORK/up; }
}
CONF
taskset -c "$LOAD_CPU" nginx -c "$WORK/up/nginx.conf" -p "$WORK/up"

cat > "$WORK/peer/nginx.conf" <<CONF
load_module $STREAM_MODULE;
worker_processes 1;
pid $WORK/peer/nginx.pid;
error_log $WORK/peer/error.log;
events { worker_connections 8192; }
stream {
  upstream backend { server 127.0.0.1:$UP_PORT; }
  server { listen 127.0.0.1:$NGINX_PORT backlog=4096; proxy_pass backend; }
}
CONF
taskset -c "$PROXY_CPU" nginx -c "$WORK/peer/nginx.conf" -p "$WORK/peer"

cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_HTTP}]
  ssl: {enable: false}
  stream_proxy:
    tcp: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  worker_processes: 1
  control: {port: $CTL_PORT}
CONF
cat > "$WORK/weir/conf/resources.yaml" <<CONF
stream_routes:
  - {id: bench, server_port: $WEIR_PORT, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}}
CONF
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$WEIR_PORT/1k" && break; sleep 0.05; done
curl -sf -o /dev/null "http://127.0.0.1:$WEIR_PORT/1k" || { echo "weir did not start:"; cat "$WORK/weir.log"; exit 1; }
curl -sf -o /dev/null "http://127.0.0.1:$NGINX_PORT/1k" || { echo "nginx stream peer not answering"; cat "$WORK/peer/error.log"; exit 1; }

# wrk prints "Transfer/sec: 1.23GB"
mbps() { awk '/Transfer\/sec/ { v=$2; u=v; gsub(/[0-9.]/,"",u); gsub(/[A-Za-z]/,"",v);
  m = (u=="GB") ? 1024 : (u=="MB") ? 1 : (u=="KB") ? 1/1024 : 1/1048576; print v*m }'; }

run() { # NAME PORT SCENARIO PIDS... -> "NAME-SCENARIO value" (conns: also "NAME-cpu us/conn")
  local name=$1 port=$2 scenario=$3 out before; shift 3
  case $scenario in
    throughput) out=$(taskset -c "$LOAD_CPU" wrk -t1 -c1 -d"${DURATION}s" "http://127.0.0.1:$port/64m")
                echo "$name-$scenario $(mbps <<<"$out")" ;;
    conns) before=$(cpu_ticks "$@")
           out=$(taskset -c "$LOAD_CPU" wrk -t1 -c16 -d"${DURATION}s" -H "Connection: close" "http://127.0.0.1:$port/1k")
           echo "$name-$scenario $(awk '/Requests\/sec/ {print $2}' <<<"$out")"
           echo "$name-cpu $(us_per $(($(cpu_ticks "$@") - before)) "$(awk '/requests in/ {print $1}' <<<"$out")")" ;;
  esac
}

# RSS per idle proxied connection: open IDLE connections through the proxy, hold them.
idle() { # NAME PORT PIDS...
  local name=$1 port=$2; shift 2
  python3 - "$port" "$IDLE" "$@" <<'PY'
import socket, sys, time
port, n, pids = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def rss():
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total
before = rss()
conns = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    conns.append(s)
time.sleep(1.0)
after = rss()
print(f"{(after - before) / n:.0f}")
PY
}

RESULTS="$WORK/results"
: > "$RESULTS"
nginx_workers=$(pgrep -P "$(cat "$WORK/peer/nginx.pid")" | tr '\n' ' ')
for round in $(seq 1 "$ROUNDS"); do
  for scenario in $SCENARIOS; do
    run weir "$WEIR_PORT" "$scenario" "$WEIR_PID" | tee -a "$RESULTS"
    # shellcheck disable=SC2086 # one argument per worker pid
    run nginx "$NGINX_PORT" "$scenario" $nginx_workers | tee -a "$RESULTS"
  done
done
echo "weir-idle $(idle weir "$WEIR_PORT" "$WEIR_PID")" | tee -a "$RESULTS"
echo "nginx-idle $(idle nginx "$NGINX_PORT" $nginx_workers)" | tee -a "$RESULTS"

echo
echo "median of $ROUNDS rounds, ${DURATION}s each; proxy on cpu $PROXY_CPU, wrk + upstream on cpu $LOAD_CPU"
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, v = line.split()
    rows.setdefault(name, []).append(float(v))
med = {k: statistics.median(v) for k, v in rows.items()}
units = {"throughput": "MB/s", "conns": "conn/s", "cpu": "us CPU/conn", "idle": "bytes/conn"}
print(f"{'scenario':12} {'weir':>12} {'nginx':>12} {'weir/nginx':>11}")
for s in ("throughput", "conns", "cpu", "idle"):
    w, n = med.get(f"weir-{s}", 0), med.get(f"nginx-{s}", 0)
    target = {"idle": "(target <= 16384 bytes)", "conns": "(target >= 1.10)", "cpu": "(lower is better)"}.get(s, "(target >= 1.00)")
    print(f"{s:12} {w:12.1f} {n:12.1f} {(w / n if n else 0):11.3f}   {units[s]} {target}")
PY
