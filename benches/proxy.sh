#!/usr/bin/env bash
# Data-plane benchmark: Weir vs nginx proxy_pass (upstream keepalive), both on one pinned core
# (worker_processes 1), wrk and the upstream on the other core. 1 KiB responses, 16 connections.
# Runs alternate (weir, nginx, weir, nginx, ...) so that drift affects both alike.
#
#   benches/proxy.sh                 # needs: wrk, nginx (apt-get install wrk nginx-light)
#   DURATION=10 ROUNDS=3 benches/proxy.sh
#
# Scenarios: plain proxy; key-auth + limit-count + proxy-rewrite; 10 vs 10,000 routes.
# Output: one line per run, then a summary table (median of the rounds) with ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-bench.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
UP_PORT=18180; NGINX_PORT=18181; WEIR_PORT=18182; CTL_PORT=18190

[ -x "$BIN" ] || cargo build --release
command -v wrk >/dev/null || { echo "wrk is required (apt-get install wrk)"; exit 1; }
command -v nginx >/dev/null || { echo "nginx is required (apt-get install nginx-light)"; exit 1; }

cleanup() {
  [ -f "$WORK/up/nginx.pid" ] && kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true
  [ -f "$WORK/peer/nginx.pid" ] && kill "$(cat "$WORK/peer/nginx.pid")" 2>/dev/null || true
  [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- the upstream: nginx answering 1 KiB, on the load core -------------------------------------
. benches/lib.sh
mkdir -p "$WORK/peer"
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"

# --- the peer: nginx proxy_pass with upstream keepalive, on the proxy core ----------------------
cat > "$WORK/peer/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/peer/nginx.pid;
error_log $WORK/peer/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:$UP_PORT; keepalive 320; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Real-IP \$remote_addr;
    }
  }
}
CONF
taskset -c "$PROXY_CPU" nginx -c "$WORK/peer/nginx.conf" -p "$WORK/peer"

# --- Weir configurations -------------------------------------------------------------------------
mkdir -p "$WORK/weir/conf"
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  worker_processes: 1
  control: {port: $CTL_PORT}
# Not the exporter's default 9091, which a gateway already running here may hold.
plugin_attr: {prometheus: {export_addr: {ip: 127.0.0.1, port: 18191}}}
CONF
plain() {
  printf 'upstreams:\n  - {id: 1, nodes: {"127.0.0.1:%s": 1}}\nroutes:\n' "$UP_PORT"
  for i in $(seq 1 "$1"); do printf '  - {id: %s, uri: /r%s/*, upstream_id: 1}\n' "$i" "$i"; done
  printf '  - {id: bench, uri: /bench, upstream_id: 1}\n'
}
checked() {
  printf 'upstreams:\n  - {id: 1, nodes: {"127.0.0.1:%s": 1}, checks: {active: {type: http, healthy: {interval: 1}}, passive: {}}}\nroutes:\n' "$UP_PORT"
  printf '  - {id: bench, uri: /bench, upstream_id: 1}\n'
}
plugins() {
  printf 'upstreams:\n  - {id: 1, nodes: {"127.0.0.1:%s": 1}}\n' "$UP_PORT"
  printf 'consumers:\n  - {username: bench, plugins: {key-auth: {key: bench-key}}}\nroutes:\n'
  printf '  - {id: bench, uri: /bench, upstream_id: 1, plugins: {key-auth: {}, limit-count: {count: 1000000000, time_window: 60}, proxy-rewrite: {uri: /1k, headers: {set: {x-bench: "1"}}}}}\n'
}

start_weir() {
  taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
  WEIR_PID=$!
  for _ in $(seq 1 200); do
    curl -s -o /dev/null "127.0.0.1:$WEIR_PORT/bench" -H 'apikey: bench-key' && return 0
    sleep 0.05
  done
  echo "weir did not start:"; cat "$WORK/weir.log"; exit 1
}
stop_weir() { kill "$WEIR_PID"; wait "$WEIR_PID" 2>/dev/null || true; WEIR_PID=; }

# run NAME PORT [header] -> prints "NAME req/s p50_ms p99_ms anon_kib cpu_us_per_request
# proxy_core_% load_core_%" (the proxy's CPU time per request repeats better than req/s here,
# and the load tool's core does not cap it; the two cores' busy shares say which one capped req/s)
run() {
  local name=$1 port=$2 header=${3:-}
  local args=(-t1 -c"$CONNS" -d"${DURATION}s" --latency)
  [ -n "$header" ] && args+=(-H "$header")
  local pids=$WEIR_PID
  [ "$port" = "$NGINX_PORT" ] && pids=$(pgrep -P "$(cat "$WORK/peer/nginx.pid")" | tr '\n' ' ')
  # shellcheck disable=SC2086 # one argument per pid
  local before; before=$(cpu_ticks $pids)
  local p0 l0 p1 l1; p0=$(core_ticks "$PROXY_CPU"); l0=$(core_ticks "$LOAD_CPU")
  local out; out=$(taskset -c "$LOAD_CPU" wrk "${args[@]}" "http://127.0.0.1:$port/bench")
  p1=$(core_ticks "$PROXY_CPU"); l1=$(core_ticks "$LOAD_CPU")
  # shellcheck disable=SC2086
  local cpu; cpu=$(us_per $(($(cpu_ticks $pids) - before)) "$(awk '/requests in/ {print $1}' <<<"$out")")
  local rps p50 p99 rss=0
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  # Weir's figure is its anonymous memory (RssAnon): its RSS also counts the pages of its
  # 23 MB executable that startup touched (file-backed, shared, reclaimable; about 20 MiB),
  # which grow with every plugin compiled in whatever the load.
  if [ "$port" = "$WEIR_PORT" ]; then rss=$(awk '/^RssAnon:/ {print $2}' "/proc/$WEIR_PID/status"); fi
  if [ "$port" = "$NGINX_PORT" ]; then
    rss=$(for w in $(pgrep -P "$(cat "$WORK/peer/nginx.pid")"); do awk '/^RssAnon:/ {print $2}' "/proc/$w/status"; done | awk '{s+=$1} END {print s}')
  fi
  echo "$name $rps $(ms "$p50") $(ms "$p99") $rss $cpu $(busy_pct "$p0" "$p1") $(busy_pct "$l0" "$l1")"
}
# wrk prints 1.23ms / 456.00us / 1.2s
ms() { awk -v v="$1" 'BEGIN { if (v ~ /us$/) { sub(/us/,"",v); print v/1000 } else if (v ~ /ms$/) { sub(/ms/,"",v); print v } else { sub(/s/,"",v); print v*1000 } }'; }

RESULTS="$WORK/results"
: > "$RESULTS"
[ "$(curl -sf "127.0.0.1:$NGINX_PORT/bench" | wc -c)" = 1024 ] || { echo "nginx peer does not answer 200 with 1 KiB"; exit 1; }
for round in $(seq 1 "$ROUNDS"); do
  plain 10 > "$WORK/weir/conf/resources.yaml"; start_weir
  run weir-plain "$WEIR_PORT" | tee -a "$RESULTS"; stop_weir
  run nginx-plain "$NGINX_PORT" | tee -a "$RESULTS"
  plugins > "$WORK/weir/conf/resources.yaml"; start_weir
  run weir-plugins "$WEIR_PORT" "apikey: bench-key" | tee -a "$RESULTS"; stop_weir
  checked > "$WORK/weir/conf/resources.yaml"; start_weir
  run weir-checks "$WEIR_PORT" | tee -a "$RESULTS"; stop_weir
  plain 10000 > "$WORK/weir/conf/resources.yaml"; start_weir
  run weir-10k-routes "$WEIR_PORT" | tee -a "$RESULTS"; stop_weir
done

echo
echo "median of $ROUNDS rounds, ${DURATION}s each, $CONNS connections, proxy on cpu $PROXY_CPU, wrk+upstream on cpu $LOAD_CPU"
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rps, p50, p99, rss, cpu, pcore, lcore = line.split()
    rows.setdefault(name, []).append((float(rps), float(p50), float(p99), int(rss), float(cpu),
                                      float(pcore), float(lcore)))
med = {k: tuple(statistics.median(x[i] for x in v) for i in range(7)) for k, v in rows.items()}
print(f"{'scenario':18} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'mem MiB':>8} {'CPU us/req':>11}"
      f" {'proxy core':>11} {'load core':>10}")
for k, (rps, p50, p99, rss, cpu, pcore, lcore) in med.items():
    print(f"{k:18} {rps:10.0f} {p50:8.3f} {p99:8.3f} {rss/1024:8.1f} {cpu:11.1f} {pcore:10.0f}% {lcore:9.0f}%")
n = med.get("nginx-plain")
w = med.get("weir-plain")
if n and w:
    print(f"\nweir/nginx req/s (plain):          {w[0]/n[0]:.3f}  (issue 9 target >= 1.05)")
    print(f"weir/nginx p99 (plain):            {w[2]/n[2]:.3f}  (issue 9 target <= 1.10)")
    print(f"nginx/weir CPU per request (plain): {n[4]/w[4]:.3f}  (above 1: Weir spends less)")
    if max(w[6], n[6]) >= 95:
        print(f"note: the load core (wrk + upstream) was {w[6]:.0f}% / {n[6]:.0f}% busy (Weir / nginx runs):"
              " req/s measured the load core as much as the proxy; CPU per request decides")
    if "weir-plugins" in med:
        print(f"weir plugins / nginx plain req/s:  {med['weir-plugins'][0]/n[0]:.3f}  (issue 9 target >= 0.95)")
    if "weir-checks" in med:
        print(f"health checks on / off req/s:      {med['weir-checks'][0]/w[0]:.3f}  (target >= 0.97)")
    if "weir-10k-routes" in med:
        print(f"10k routes / 10 routes req/s:      {med['weir-10k-routes'][0]/w[0]:.3f}  (issue 9 target >= 0.97)")
    if "weir-10k-routes" in med:
        print(f"weir anonymous memory, 10k routes: {med['weir-10k-routes'][3]/1024:.1f} MiB under load (RSS less the executable's pages)")
PY
