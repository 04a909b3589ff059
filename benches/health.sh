#!/usr/bin/env bash
# Health-check cost: 2,000 targets probed every second (http probes), measured as the CPU the
# weir process uses while otherwise idle. Targets are 2,000 distinct loopback addresses
# (127.0.x.y) served by one nginx listening on all addresses.
#
#   benches/health.sh            # needs nginx; TARGETS=2000 SECONDS_MEASURED=20 TYPE=http
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=${TARGETS:-2000}
MEASURE=${SECONDS_MEASURED:-20}
TYPE=${TYPE:-http}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-health-bench.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
UP_PORT=18480; WEIR_PORT=18482; CTL_PORT=18490
[ -x "$BIN" ] || cargo build --release
cleanup() {
  [ -f "$WORK/up/nginx.pid" ] && kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true
  [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/up" "$WORK/weir/conf"
echo ok > "$WORK/up/index.html"
cat > "$WORK/up/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/up/nginx.pid;
error_log $WORK/up/error.log;
events { worker_connections 8192; }
http { access_log off; server { listen $UP_PORT; root $WORK/up; } }
CONF
nginx -c "$WORK/up/nginx.conf" -p "$WORK/up"
printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  worker_processes: 1\n  control: {port: %s}\n' "$WEIR_PORT" "$CTL_PORT" > "$WORK/weir/conf/config.yaml"
{
  printf 'routes:\n  - id: many\n    uri: /*\n    upstream:\n      checks: {active: {type: %s, healthy: {interval: 1}, unhealthy: {interval: 1}}}\n      nodes:\n' "$TYPE"
  n=0
  for a in $(seq 1 250); do for b in $(seq 1 250); do
    [ "$n" -ge "$TARGETS" ] && break 2
    printf '        "127.0.%s.%s:%s": 1\n' "$a" "$b" "$UP_PORT"; n=$((n+1))
  done; done
} > "$WORK/weir/conf/resources.yaml"
"$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
sleep 1
curl -s -o /dev/null "127.0.0.1:$WEIR_PORT/"          # the first request creates the checker
sleep 3                                                 # let every probe task start
ticks() { awk '{print $14+$15}' "/proc/$WEIR_PID/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); sleep "$MEASURE"; t1=$(ticks)
healthy=$(curl -s "127.0.0.1:$CTL_PORT/v1/healthcheck/routes/many" | grep -o '"status":"healthy"' | wc -l)
rss=$(ps -o rss= -p "$WEIR_PID" | tr -d ' ')
python3 - "$t0" "$t1" "$hz" "$MEASURE" "$TARGETS" "$healthy" "$rss" "$TYPE" <<'PY'
import sys
t0, t1, hz, secs, targets, healthy, rss, kind = sys.argv[1:]
cpu = (int(t1) - int(t0)) / int(hz) / int(secs) * 100
print(f"{targets} {kind} targets probed every 1 s: {cpu:.1f}% of one core, {healthy} healthy, RSS {int(rss)/1024:.1f} MiB")
PY
