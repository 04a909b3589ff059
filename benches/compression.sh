#!/usr/bin/env bash
# gzip (and brotli) of a 100 KiB JSON body, Weir against nginx `gzip on`, same machine, same
# run, same level (1: the default of both, and APISIX's), same upstream (an nginx serving the
# file). One pinned core for the proxy under test, one for wrk + the upstream; rounds alternate
# between the two proxies so that drift affects both alike. Also prints each one's compressed
# size, to show the levels compare.
#
#   benches/compression.sh              # needs: wrk, nginx, a release build
#   DURATION=8 ROUNDS=3 LEVEL=6 benches/compression.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
LEVEL=${LEVEL:-1}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
[ -x "$BIN" ] || cargo build --release
WORK=$(mktemp -d /tmp/weir-gzip-bench.XXXXXX)
chmod 755 "$WORK"
PIDS=()
. benches/lib.sh
# The proxying nginx under test is stopped with the rest.
trap '[ -f "$WORK/ngx/nginx.pid" ] && kill "$(cat "$WORK/ngx/nginx.pid")" 2>/dev/null; bench_cleanup' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# The document: 100 KiB of JSON records.
mkdir -p "$WORK/up"
python3 -c '
import json, sys
rows, i = [], 0
while len(json.dumps(rows)) < 100 * 1024:
    rows.append({"id": i, "name": "item-%d" % i, "price": i * 3 % 997, "tags": ["a", "b", "c%d" % (i % 7)]})
    i += 1
open(sys.argv[1], "w").write(json.dumps(rows)[: 100 * 1024 - 1] + "]")
' "$WORK/up/doc.json"
UP_PORT=$(port); WEIR_PORT=$(port); CTL_PORT=$(port); NGX_PORT=$(port)
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU" "root $WORK/up; default_type application/json; try_files /doc.json =404;"

mkdir -p "$WORK/weir/conf" "$WORK/ngx"
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  worker_processes: 1
  control: {port: $CTL_PORT}
  ssl: {enable: false}
CONF
cat > "$WORK/weir/conf/resources.yaml" <<CONF
routes:
  - id: gz
    uri: /gz
    plugins: {gzip: {types: ["application/json"], comp_level: $LEVEL}, proxy-rewrite: {uri: /doc.json}}
    upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}, keepalive_pool: {size: 64}}
  - id: br
    uri: /br
    plugins: {brotli: {types: ["application/json"], comp_level: $LEVEL}, proxy-rewrite: {uri: /doc.json}}
    upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}, keepalive_pool: {size: 64}}
CONF
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
PIDS+=($!)
cat > "$WORK/ngx/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/ngx/nginx.pid;
error_log $WORK/ngx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$NGX_PORT;
    gzip on; gzip_comp_level $LEVEL; gzip_types application/json; gzip_proxied any; gzip_min_length 20;
    location /gz { proxy_pass http://up/doc.json; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
taskset -c "$PROXY_CPU" nginx -c "$WORK/ngx/nginx.conf" -p "$WORK/ngx"
for _ in $(seq 1 100); do curl -sf -o /dev/null "127.0.0.1:$WEIR_PORT/gz" && curl -sf -o /dev/null "127.0.0.1:$NGX_PORT/gz" && break; sleep 0.1; done

size() { curl -s -H 'Accept-Encoding: gzip, br' "$1" | wc -c; }
echo "100 KiB JSON at level $LEVEL: compressed bytes weir gzip $(curl -s -H 'Accept-Encoding: gzip' "127.0.0.1:$WEIR_PORT/gz" | wc -c), nginx gzip $(curl -s -H 'Accept-Encoding: gzip' "127.0.0.1:$NGX_PORT/gz" | wc -c), weir brotli $(size "127.0.0.1:$WEIR_PORT/br")"
curl -s -H 'Accept-Encoding: gzip' "127.0.0.1:$WEIR_PORT/gz" | gunzip | cmp - "$WORK/up/doc.json" || { echo "weir's gzip does not decode to the document"; exit 1; }

cat > "$WORK/gz.lua" <<'LUA'
wrk.headers["Accept-Encoding"] = "gzip"
LUA
cat > "$WORK/br.lua" <<'LUA'
wrk.headers["Accept-Encoding"] = "br"
LUA
rps() { local out; out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$2" "$1"); echo "$out" | awk '/Requests\/sec/ {print $2}'; }
W=(); N=(); B=()
for r in $(seq 1 "$ROUNDS"); do
  W+=("$(rps "http://127.0.0.1:$WEIR_PORT/gz" "$WORK/gz.lua")")
  N+=("$(rps "http://127.0.0.1:$NGX_PORT/gz" "$WORK/gz.lua")")
  B+=("$(rps "http://127.0.0.1:$WEIR_PORT/br" "$WORK/br.lua")")
  echo "  round $r: weir gzip ${W[-1]}  nginx gzip ${N[-1]}  weir brotli ${B[-1]} req/s"
done
w=$(median "${W[@]}"); n=$(median "${N[@]}"); b=$(median "${B[@]}")
echo "gzip level $LEVEL, 100 KiB JSON (median of $ROUNDS): weir $w req/s, nginx $n req/s ($(python3 -c "print(f'{$w/$n:.3f}')")x nginx); weir brotli $b req/s"
