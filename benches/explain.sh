#!/usr/bin/env bash
# POST /v1/explain with 10,000 routes loaded: the server's own time (`took_us`) and the round trip
# (curl), median and max over N requests, for four request shapes: an exact URI, a parameter URI,
# a prefix shared by 50 routes that differ by host (50 candidates, each explained), and a miss.
# The goal (issue 26): under 5 ms.
#
#   benches/explain.sh                      # release build (built if missing)
#   BIN=target/debug/weir N=100 benches/explain.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200}
BIN=${BIN:-target/release/weir}
NODE_PORT=${NODE_PORT:-18382}
CTL_PORT=${CTL_PORT:-18390}
[ -x "$BIN" ] || cargo build --release
command -v curl >/dev/null || { echo "curl is required"; exit 1; }
WORK=$(mktemp -d /tmp/weir-explain.XXXXXX)
cleanup() { [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK/conf"
cat > "$WORK/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $NODE_PORT}]
  worker_processes: 1
  control: {port: $CTL_PORT}
CONF
python3 - "$WORK/conf/resources.yaml" <<'PY'
import sys
out = ["upstreams:", "  - id: pool", "    nodes: {\"127.0.0.1:1980\": 1, \"127.0.0.1:1981\": 2}", "routes:"]
n = 0
def route(line):
    global n
    out.append("  - " + line)
    n += 1
for i in range(50):
    route("{id: shared-%d, uri: /shared/*, hosts: [h%d.example.com], upstream_id: pool}" % (i, i))
for i in range(3000):
    route("{id: p%d, uri: /svc%d/users/:id, methods: [GET, POST], upstream_id: pool}" % (i, i))
while n < 10000:
    route("{id: e%d, uri: /api/v1/item%d, upstream_id: pool, plugins: {proxy-rewrite: {headers: {set: {x-n: \"%d\"}}}}}" % (n, n, n))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
"$BIN" -p "$WORK" > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$CTL_PORT/v1/config_status" >/dev/null 2>&1 && break
  sleep 0.1
done
loaded=$(curl -s "http://127.0.0.1:$CTL_PORT/v1/routes" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
echo "routes loaded: $loaded"

run() { # NAME BODY
  local name=$1 body=$2 i
  : > "$WORK/took" ; : > "$WORK/rtt"
  for i in $(seq 1 "$N"); do
    curl -s -o "$WORK/body" -w '%{time_total}\n' -H 'Content-Type: application/json' \
      -d "$body" "http://127.0.0.1:$CTL_PORT/v1/explain" >> "$WORK/rtt"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["took_us"])' "$WORK/body" >> "$WORK/took"
  done
  python3 - "$name" "$WORK/took" "$WORK/rtt" "$WORK/body" <<'PY'
import json, sys
name, took, rtt, body = sys.argv[1:]
t = sorted(int(x) for x in open(took))
r = sorted(float(x) * 1000 for x in open(rtt))
e = json.load(open(body))
print("%-30s candidates %3d  took_us median %6d max %6d   round trip ms median %6.2f max %6.2f   (%s)" % (
    name, len(e["candidates"]), t[len(t) // 2], t[-1], r[len(r) // 2], r[-1], e["verdict"]["summary"][:60]))
PY
}
run "exact" '{"uri": "/api/v1/item9000"}'
run "parameter" '{"method": "POST", "uri": "/svc2999/users/42"}'
run "prefix, 50 candidates" '{"uri": "/shared/x/y", "host": "h49.example.com"}'
run "miss" '{"uri": "/nothing/here"}'
