#!/usr/bin/env bash
# Memory per idle keep-alive client connection: Weir vs nginx (proxy_pass), same upstream.
# Opens N connections that each send one GET, read the answer and stay open; reports
# (RSS after - RSS before) / N for each server. Kernel socket memory is not in RSS.
# SETTLE (default 15 s) is how long the connections idle before RSS is read: Weir parks a
# connection after 1 s idle, and jemalloc returns the freed pages within its ~10 s decay.
#
#   benches/idle_conns.sh            # needs nginx; N=5000
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5000}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-idle.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
UP=18380; NGX=18381; WEIR=18382; CTL=18390
[ -x "$BIN" ] || cargo build --release
command -v nginx >/dev/null || { echo "nginx is required (apt-get install nginx-light)"; exit 1; }
ulimit -n $((N * 2 + 1000))
cleanup() {
  for p in "$WORK"/*/nginx.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
  [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/up" "$WORK/peer" "$WORK/weir/conf"
cat > "$WORK/up/nginx.conf" <<CONF
worker_processes 1; pid $WORK/up/nginx.pid; error_log $WORK/up/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$UP; location / { return 200 "ok"; } } }
CONF
cat > "$WORK/peer/nginx.conf" <<CONF
worker_processes 1; pid $WORK/peer/nginx.pid; error_log $WORK/peer/error.log;
events { worker_connections $((N + 100)); }
worker_rlimit_nofile $((N * 2 + 100));
http { access_log off; keepalive_timeout 300s; keepalive_requests 100000;
  upstream u { server 127.0.0.1:$UP; keepalive 32; }
  server { listen 127.0.0.1:$NGX; location / { proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
nginx -c "$WORK/up/nginx.conf" -p "$WORK/up"
nginx -c "$WORK/peer/nginx.conf" -p "$WORK/peer"
printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  worker_processes: 1\n  control: {port: %s}\n' "$WEIR" "$CTL" > "$WORK/weir/conf/config.yaml"
printf 'routes:\n  - {id: 1, uri: /*, upstream: {nodes: {"127.0.0.1:%s": 1}}}\n' "$UP" > "$WORK/weir/conf/resources.yaml"
"$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$WEIR/" && break; sleep 0.05; done

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
measure() { # name port pid
  python3 - "$2" "$N" "$3" <<'PY'
import socket, sys, time
port, n, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def rss():
    # Anonymous memory only: code pages of the binary that a first park or wake touches are
    # resident once, not per connection (and read a different amount with each build's layout).
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
def hold(k):
    socks = []
    for _ in range(k):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /x HTTP/1.1\r\nHost: b\r\n\r\n")
        data = b""
        while b"ok" not in data:
            data += s.recv(4096)
        socks.append(s)
    return socks
warm = hold(200)
# Long enough for the warm connections to park (1 s), so that code path has run before.
time.sleep(2.5)
before = rss()
socks = hold(n)
time.sleep(float(__import__("os").environ.get("SETTLE", "15")))
after = rss()
print(f"{(after - before) * 1024 / n:.0f}")
for s in socks + warm:
    s.close()
PY
}
ngx_worker=$(pgrep -P "$(cat "$WORK/peer/nginx.pid")" | head -1)
w=$(measure weir "$WEIR" "$WEIR_PID")
g=$(measure nginx "$NGX" "$ngx_worker")
echo "RSS per idle keep-alive connection, $N connections: weir $w B, nginx $g B"
