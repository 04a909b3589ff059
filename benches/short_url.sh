#!/usr/bin/env bash
# short-url benchmarks (wrk + Lua), Weir on one pinned core (worker_processes 1), wrk on the other.
#   - creation: 100-entry batches from 16 connections -> URLs/s, batch p50/p99
#   - redirect, cached: one hot code -> req/s (compare with the plain-proxy figure of proxy.sh)
#   - redirect, uncached: random codes among STORED (default 1,000,000) after a restart -> req/s
#   - scale (SCALE=10000000): creation and lookup speed with that many codes vs an empty store
# Backend: sqlite (default) or BACKEND=postgres PG_URL=postgres://...
#
#   benches/short_url.sh            # needs wrk; DURATION=10 STORED=1000000 SCALE=0
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
STORED=${STORED:-1000000}
SCALE=${SCALE:-0}
BACKEND=${BACKEND:-sqlite}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-su-bench.XXXXXX)
PORT=18582; CTL=18590
[ -x "$BIN" ] || cargo build --release
cleanup() { [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK/conf"
{
  printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  worker_processes: 1\n  control: {port: %s}\n' "$PORT" "$CTL"
  if [ "$BACKEND" = postgres ]; then printf 'plugin_attr:\n  short-url:\n    storage: {backend: postgres, url: "%s"}\n' "$PG_URL"; fi
} > "$WORK/conf/config.yaml"
cat > "$WORK/conf/resources.yaml" <<CONF
routes:
  - {id: c, uri: /short/v1/urls, methods: [POST], plugins: {short-url: {}}}
  - {id: r, uri: /s/*, methods: [GET, HEAD], plugins: {short-url: {action: resolve}}}
plugin_metadata:
  - {id: short-url, short_base: "http://127.0.0.1:$PORT/s"}
CONF
start() {
  taskset -c 0 "$BIN" -p "$WORK" > "$WORK/weir.log" 2>&1 &
  WEIR_PID=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null "127.0.0.1:$CTL/v1/schema" && return 0; sleep 0.05; done
  cat "$WORK/weir.log"; exit 1
}
stop() { kill "$WEIR_PID"; wait "$WEIR_PID" 2>/dev/null || true; WEIR_PID=; }

# A 100-entry body.
python3 -c "import json; print(json.dumps([{'origin_url': f'https://bench.example/item/{i}?q=x'} for i in range(100)]))" > "$WORK/body.json"
cat > "$WORK/create.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$WORK/body.json"); wrk.body = f:read("*a"); f:close()
LUA
cat > "$WORK/random.lua" <<LUA
local codes = {}
for line in io.lines("$WORK/codes.txt") do codes[#codes + 1] = line end
math.randomseed(os.time())
request = function() return wrk.format("GET", "/s/" .. codes[math.random(#codes)]) end
LUA

wrkrun() { taskset -c 1 wrk -t1 -c16 -d"${DURATION}s" --latency "$@"; }
summary() { # label output multiplier
  awk -v label="$1" -v mult="$3" '/Requests\/sec/ {rps=$2} $1=="50%" {p50=$2} $1=="99%" {p99=$2} /Non-2xx/ {bad=$5}
    END { printf "%-34s %10.0f/s  p50 %8s  p99 %8s  %s\n", label, rps*mult, p50, p99, (bad ? "non-2xx: " bad : "") }' <<<"$2"
}
count() { curl -s "127.0.0.1:$CTL/v1/plugin/short-url/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["codes"])'; }
fill() { # to N codes, with 100-entry batches from 16 parallel clients
  local target=$1 have; have=$(count)
  python3 - "$PORT" "$WORK/body.json" "$target" "$have" <<'PY'
import sys, json, urllib.request, concurrent.futures
port, body, target, have = sys.argv[1], open(sys.argv[2], 'rb').read(), int(sys.argv[3]), int(sys.argv[4])
def one(_):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/short/v1/urls", data=body, headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req).status
need = max(0, (target - have) // 100)
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    list(ex.map(one, range(need)))
PY
}
dump_codes() { # a sample of stored codes for the random-lookup script
  local n=$1
  if [ "$BACKEND" = sqlite ]; then
    python3 -c "import sqlite3,sys; c=sqlite3.connect('$WORK/data/short-url.db'); print('\n'.join(r[0] for r in c.execute('select code from codes order by random() limit $n')))" > "$WORK/codes.txt"
  else
    psql "$PG_URL" -Atc "select code from short_url_codes order by random() limit $n" > "$WORK/codes.txt"
  fi
}

echo "backend: $BACKEND, ${DURATION}s runs, 16 connections, weir on cpu 0, wrk on cpu 1"
start
out=$(wrkrun -s "$WORK/create.lua" "http://127.0.0.1:$PORT/short/v1/urls"); summary "create, empty store (URLs)" "$out" 100
code=$(curl -s -X POST "127.0.0.1:$PORT/short/v1/urls" -H 'Content-Type: application/json' -d '[{"origin_url":"https://hot.example/"}]' | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["data"]["short_code"])')
out=$(wrkrun "http://127.0.0.1:$PORT/s/$code"); summary "redirect, cached hot code" "$out" 1
fill "$STORED"
stored=$(count)
echo "stored codes: $stored (the creation run above stored some already)"
dump_codes 200000
stop; start
out=$(wrkrun -s "$WORK/random.lua" "http://127.0.0.1:$PORT"); summary "redirect, uncached ($stored stored)" "$out" 1
if [ "$SCALE" -gt 0 ]; then
  fill "$SCALE"
  stored=$(count)
  echo "stored codes: $stored"
  dump_codes 200000
  stop; start
  out=$(wrkrun -s "$WORK/create.lua" "http://127.0.0.1:$PORT/short/v1/urls"); summary "create, $stored stored (URLs)" "$out" 100
  out=$(wrkrun -s "$WORK/random.lua" "http://127.0.0.1:$PORT"); summary "redirect, uncached ($stored stored)" "$out" 1
fi
stop
echo "database size: $(du -sh "$WORK/data" 2>/dev/null | cut -f1)"
