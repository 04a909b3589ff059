#!/usr/bin/env bash
# User-space CPU instructions per proxied TCP connection of the stream proxy, Weir `stream_routes`
# vs nginx `stream { proxy_pass }`, counted with valgrind's callgrind (kernel work is not counted,
# so the figure is repeatable on a noisy VM, as `../shared/tools/instr_per_request.sh` is for HTTP).
#
#   benches/instr_per_stream_conn.sh        # needs: valgrind, nginx with the stream module, python3
#   WEIR_BIN=path/to/weir CALLGRIND_OUT=DIR benches/instr_per_stream_conn.sh
#
# Each connection: connect, send a ~40-byte HTTP request, read the 1 KiB answer until the upstream
# (nginx, `Connection: close`) closes, close. Counted as (cost at N2 - cost at N1) / (N2 - N1), so
# start-up and shutdown cancel out. Prints 'instructions per connection: weir X nginx Y ratio Z'.
set -u
cd "$(dirname "$0")/.."
bin=$(readlink -f "${WEIR_BIN:-target/release/weir}")
STREAM_MODULE=${STREAM_MODULE:-/usr/lib/nginx/modules/ngx_stream_module.so}
[ -x "$bin" ] || { echo "no $bin (cargo build --release)"; exit 1; }
[ -f "$STREAM_MODULE" ] || { echo "nginx's stream module is required (apt-get install libnginx-mod-stream)"; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is required"; exit 1; }
w=$(mktemp -d /tmp/ipc.XXXX)
trap 'kill $(jobs -p) 2>/dev/null; sleep 0.3; rm -rf "$w"' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
UP=$(port)
body=$(head -c 1024 /dev/zero | tr '\0' 'x')
mkdir -p "$w/up" "$w/ng" "$w/weir/conf"
cat > "$w/up/nginx.conf" <<C
worker_processes 1; daemon off; pid $w/up/pid; error_log $w/up/err.log;
events { worker_connections 1024; }
http { access_log off; keepalive_timeout 0;
  server { listen 127.0.0.1:$UP; location / { return 200 "$body"; } } }
C
nginx -p "$w/up" -c "$w/up/nginx.conf" 2>/dev/null &
load() { # port count
  python3 - "$1" "$2" <<'P'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
bad = 0
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /x HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    s.close()
    bad += not (got.startswith(b"HTTP/1.1 200") and len(got) > 1024)
sys.exit(1 if bad else 0)
P
}
wait_port() { for _ in $(seq 300); do python3 -c "import socket;socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0; sleep 0.2; done; return 1; }
total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
measure() { # name n -> prints total instructions
  local name=$1 n=$2 p; p=$(port)
  if [ "$name" = nginx ]; then
    cat > "$w/ng/nginx.conf" <<C
load_module $STREAM_MODULE;
worker_processes 1; master_process off; daemon off; pid $w/ng/pid; error_log $w/ng/err.log;
events { worker_connections 1024; }
stream { server { listen 127.0.0.1:$p; proxy_pass 127.0.0.1:$UP; } }
C
    valgrind --tool=callgrind --callgrind-out-file="$w/cg.$name.$n" nginx -p "$w/ng" -c "$w/ng/nginx.conf" >/dev/null 2>&1 &
  else
    local c h; c=$(port); h=$(port)
    echo "{\"gateway\": {\"node_listen\": [$h], \"stream_proxy\": {\"tcp\": [{\"ip\": \"127.0.0.1\", \"port\": $p}]}, \"worker_processes\": 1, \"control\": {\"port\": $c}}}" > "$w/weir/conf/config.yaml"
    echo "{\"stream_routes\": [{\"id\": 1, \"upstream\": {\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$UP\": 1}}}]}" > "$w/weir/conf/resources.yaml"
    (cd "$w/weir" && RUST_LOG=error exec valgrind --tool=callgrind --callgrind-out-file="$w/cg.$name.$n" "$bin" -p "$w/weir" >/dev/null 2>&1) &
  fi
  local pid=$!
  wait_port "$p" || { echo "$name did not start" >&2; return 1; }
  load "$p" 50 || { echo "$name did not relay the answer" >&2; return 1; }
  load "$p" "$n" || { echo "$name did not relay the answer" >&2; return 1; }
  if [ "$name" = nginx ]; then kill -QUIT $pid; else kill -TERM $pid; fi
  wait $pid 2>/dev/null
  total "$w/cg.$name.$n"
}
N1=${N1:-500}; N2=${N2:-1500}
for name in weir nginx; do
  a=$(measure $name $N1) || exit 1; b=$(measure $name $N2) || exit 1
  eval "per_$name=\$(( (b - a) / (N2 - N1) ))"
  echo "$name: $a instructions at $N1 connections, $b at $N2"
done
[ -n "${CALLGRIND_OUT:-}" ] && mkdir -p "$CALLGRIND_OUT" && cp "$w"/cg.* "$CALLGRIND_OUT"/
python3 -c "import sys; w,n=int(sys.argv[1]),int(sys.argv[2]); print(f'instructions per connection: weir {w} nginx {n} ratio {w/n:.2f}')" "$per_weir" "$per_nginx"
