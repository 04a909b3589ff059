#!/usr/bin/env bash
# short-url as a product (issue 28): what visits, options and the management API cost.
# Weir on one pinned core (worker_processes 1), wrk on the other; 16 connections.
#   - creation: 100-entry batches on an empty store (compare with benches/short_url.sh)
#   - redirect, hot code: visits recorded vs `visits.enabled: false`
#   - redirect, uncached: random codes among STORED (default 1,000,000), visits on vs off
#   - list: GET /short/v1/urls with search (common and rare term), plain, ordered by visits:
#     p50/p99 with STORED links
# Backend: sqlite (default) or BACKEND=postgres PG_URL=postgres://...
#
#   benches/short_url_manage.sh        # needs wrk; DURATION=10 STORED=1000000
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
STORED=${STORED:-1000000}
BACKEND=${BACKEND:-sqlite}
BIN=${BIN:-target/release/weir}
# KEEP=DIR: work in DIR and keep it (its filled store is reused by the next run).
if [ -n "${KEEP:-}" ]; then WORK=$KEEP; mkdir -p "$WORK"; else WORK=$(mktemp -d /tmp/weir-sum-bench.XXXXXX); fi
PORT=18682; CTL=18690
[ -x "$BIN" ] || cargo build --release
cleanup() { [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK/conf"
config() { # visits on|off
  {
    printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  worker_processes: 1\n  control: {port: %s}\n' "$PORT" "$CTL"
    printf 'plugin_attr:\n  short-url:\n'
    if [ "$BACKEND" = postgres ]; then printf '    storage: {backend: postgres, url: "%s"}\n' "$PG_URL"; fi
    if [ "$1" = off ]; then printf '    visits: {enabled: false}\n'; else printf '    visits: {enabled: true}\n'; fi
  } > "$WORK/conf/config.yaml"
}
cat > "$WORK/conf/resources.yaml" <<CONF
routes:
  - {id: c, uri: /short/v1/urls, methods: [POST], plugins: {short-url: {}}}
  - {id: m, uris: [/short/v1/urls, /short/v1/urls/*], methods: [GET, PATCH, DELETE], plugins: {short-url: {action: manage}}}
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
    END { printf "%-44s %10.0f/s  p50 %8s  p99 %8s  %s\n", label, rps*mult, p50, p99, (bad ? "non-2xx: " bad : "") }' <<<"$2"
}
count() { curl -s "127.0.0.1:$CTL/v1/plugin/short-url/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["codes"])'; }
fill() { # to N links with varied URLs and titles: 1,000 sites, a unique path each
  local target=$1 have; have=$(count)
  python3 - "$PORT" "$target" "$have" <<'PY'
import sys, json, urllib.request, concurrent.futures
port, target, have = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def one(n):
    body = json.dumps([{"origin_url": f"https://site{(n * 100 + i) % 1000}.example/p/{n}-{i}",
                        "title": f"page {n}-{i}"} for i in range(100)]).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/short/v1/urls", data=body, headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req).status
need = max(0, (target - have) // 100)
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    list(ex.map(one, range(need)))
PY
}
dump_codes() {
  if [ "$BACKEND" = sqlite ]; then
    python3 -c "import sqlite3; c=sqlite3.connect('$WORK/data/short-url.db'); print('\n'.join(r[0] for r in c.execute('select code from codes order by random() limit 200000')))" > "$WORK/codes.txt"
  else
    psql "$PG_URL" -Atc "select code from short_url_codes order by random() limit 200000" > "$WORK/codes.txt"
  fi
}
echo "backend: $BACKEND, ${DURATION}s runs, 16 connections, weir on cpu 0, wrk on cpu 1"
config on; start
out=$(wrkrun -s "$WORK/create.lua" "http://127.0.0.1:$PORT/short/v1/urls"); summary "create, empty store (URLs)" "$out" 100
code=$(curl -s -X POST "127.0.0.1:$PORT/short/v1/urls" -H 'Content-Type: application/json' -d '[{"origin_url":"https://hot.example/"}]' | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["data"]["short_code"])')
out=$(wrkrun "http://127.0.0.1:$PORT/s/$code"); summary "redirect, hot code, visits on" "$out" 1
sleep 2
echo "visits recorded: $(curl -s "127.0.0.1:$PORT/short/v1/urls/$code" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["visits"]["total"])'), dropped: $(curl -s "127.0.0.1:$CTL/v1/plugin/short-url/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["visits_dropped"])')"
stop; config off; start
out=$(wrkrun "http://127.0.0.1:$PORT/s/$code"); summary "redirect, hot code, visits off" "$out" 1
config on; stop; start
fill "$STORED"
stored=$(count); echo "stored links: $stored"
dump_codes
stop; start
out=$(wrkrun -s "$WORK/random.lua" "http://127.0.0.1:$PORT"); summary "redirect, uncached ($stored), visits on" "$out" 1
stop; config off; start
out=$(wrkrun -s "$WORK/random.lua" "http://127.0.0.1:$PORT"); summary "redirect, uncached ($stored), visits off" "$out" 1
stop; config on; start
for q in "page_size=20" "search=site7.example&page_size=20" "search=p%2F4242-&page_size=20" "search=page%20999-99&page_size=20" "order_by=-visits&page_size=20"; do
  out=$(DURATION=$DURATION wrkrun -c4 "http://127.0.0.1:$PORT/short/v1/urls?$q"); summary "list $q" "$out" 1
done
stop
echo "database size: $(du -sh "$WORK/data" 2>/dev/null | cut -f1)"
