#!/usr/bin/env bash
# proxy-cache benchmark: req/s of a cache HIT (memory zone, disk zone) against the same request
# proxied without a cache (the MISS path's cost), and against nginx proxy_cache HITs, in one run.
# Weir and the nginx peer on one pinned core (worker_processes 1), wrk and the upstream (nginx
# answering 1 KiB) on the other. Runs alternate so that drift affects all alike.
#
#   benches/cache.sh                 # needs: wrk, nginx (apt-get install wrk nginx-light)
#   DURATION=10 ROUNDS=3 benches/cache.sh
#
# Targets: HIT >= 2x proxied, HIT >= nginx proxy_cache HIT.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/weir}
WORK=$(mktemp -d /tmp/weir-cache-bench.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
UP_PORT=18280; NGINX_PORT=18281; WEIR_PORT=18282; CTL_PORT=18290
PIDS=()

[ -x "$BIN" ] || cargo build --release
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)"; exit 1; }
command -v nginx >/dev/null || { echo "nginx is required (apt-get install nginx-light)"; exit 1; }

. benches/lib.sh
cleanup() {
  [ -f "$WORK/peer/nginx.pid" ] && kill "$(cat "$WORK/peer/nginx.pid")" 2>/dev/null || true
  bench_cleanup
}
trap cleanup EXIT

# --- the upstream: nginx answering 1 KiB for every path, on the load core -------------------------
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"

# --- the peer: nginx proxy_cache (on disk, as APISIX's disk zones), on the proxy core --------------
mkdir -p "$WORK/peer/cache"
cat > "$WORK/peer/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/peer/nginx.pid;
error_log $WORK/peer/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:$UP_PORT; keepalive 320; }
  proxy_cache_path $WORK/peer/cache levels=1:2 keys_zone=disk_cache_one:50m inactive=1d max_size=1G use_temp_path=off;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_cache disk_cache_one;
      proxy_cache_key \$host\$request_uri;
      proxy_cache_valid any 1h;
      proxy_cache_lock on;
      add_header Apisix-Cache-Status \$upstream_cache_status;
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
    }
  }
}
CONF
taskset -c "$PROXY_CPU" nginx -c "$WORK/peer/nginx.conf" -p "$WORK/peer"

# --- Weir: a memory-zone route, a disk-zone route, a route without the plugin ---------------------
mkdir -p "$WORK/weir/conf"
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  worker_processes: 1
  control: {port: $CTL_PORT}
CONF
cat > "$WORK/weir/conf/resources.yaml" <<CONF
upstreams:
  - {id: 1, nodes: {"127.0.0.1:$UP_PORT": 1}}
routes:
  - {id: mem, uri: /hit-memory, upstream_id: 1, plugins: {proxy-cache: {cache_strategy: memory, cache_zone: memory_cache, cache_ttl: 3600}}}
  - {id: disk, uri: /hit-disk, upstream_id: 1, plugins: {proxy-cache: {cache_ttl: 3600}}}
  - {id: plain, uri: /proxied, upstream_id: 1}
CONF
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 200); do curl -s -o /dev/null "127.0.0.1:$WEIR_PORT/proxied" && break; sleep 0.05; done

# Warm both caches, and check that what is measured is what it says.
for url in "$WEIR_PORT/hit-memory" "$WEIR_PORT/hit-disk" "$NGINX_PORT/hit"; do
  curl -s -o /dev/null "127.0.0.1:$url"; sleep 0.2
  status=$(curl -s -o /dev/null -D - "127.0.0.1:$url" | tr -d '\r' | awk -F': ' 'tolower($1)=="apisix-cache-status" {print $2}')
  [ "$status" = HIT ] || { echo "127.0.0.1:$url is not a HIT ($status)"; cat "$WORK/weir.log"; exit 1; }
done
[ "$(curl -sf "127.0.0.1:$WEIR_PORT/proxied" | wc -c)" = 1024 ] || { echo "weir does not proxy 1 KiB"; exit 1; }

RESULTS="$WORK/results"
: > "$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  for s in "weir-hit-memory $WEIR_PORT/hit-memory" "weir-hit-disk $WEIR_PORT/hit-disk" \
           "weir-proxied $WEIR_PORT/proxied" "nginx-hit $NGINX_PORT/hit"; do
    set -- $s
    echo "$1 $(wrk_rps "http://127.0.0.1:$2")" | tee -a "$RESULTS"
  done
done

echo
echo "median of $ROUNDS rounds, ${DURATION}s each, $CONNS connections, 1 KiB bodies, proxy on cpu $PROXY_CPU, wrk+upstream on cpu $LOAD_CPU"
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rps = line.split()
    rows.setdefault(name, []).append(float(rps))
med = {k: statistics.median(v) for k, v in rows.items()}
for k, v in med.items():
    print(f"{k:18} {v:10.0f} req/s")
p, n = med["weir-proxied"], med["nginx-hit"]
for zone in ("memory", "disk"):
    h = med[f"weir-hit-{zone}"]
    print(f"HIT ({zone}) / proxied:        {h/p:.2f}  (target >= 2)")
    print(f"HIT ({zone}) / nginx HIT:      {h/n:.2f}  (target >= 1)")
PY
