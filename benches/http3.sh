#!/usr/bin/env bash
# HTTP/3 (issue 27): Weir's HTTP/3 vs its HTTP/2 on the same route, and vs Caddy's HTTP/3 and
# HTTP/2 (Debian's caddy), all proxying to one nginx upstream (1 KiB). HTTP/3 load comes from
# aioquic (benches/h3_load.py, in a virtualenv made here): one Python process caps the rate, so
# each line also gives the server's CPU per request (user + system time of its process over
# the run / requests), which does not depend on the client. HTTP/2 load is h2load.
#
#   benches/http3.sh        # needs: nginx, caddy, h2load, python3-venv, openssl, curl
#   DURATION=10 CONNS=4 STREAMS=8 benches/http3.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
CONNS=${CONNS:-4}
STREAMS=${STREAMS:-8}
LOAD_CPU=${LOAD_CPU:-1}
PROXY_CPU=${PROXY_CPU:-0}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-h3.XXXXXX)
chmod 755 "$WORK"
UP=18600; WEIR=18601; CTL=18602; CADDY=18603
[ -x "$BIN" ] || cargo build --release
for tool in nginx caddy h2load openssl curl python3; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done
VENV=${VENV:-target/h3-bench-venv}
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q 'aioquic>=1.2,<2'; }

PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT
nginx_upstream "$WORK/up" "$UP" "$LOAD_CPU"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench.test \
  -addext subjectAltName=DNS:bench.test -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

mkdir -p "$WORK/weir/conf"
indent() { sed 's/^/      /' "$1"; }
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: 18604}]
  worker_processes: 1
  control: {port: $CTL}
  ssl:
    listen: [{ip: 127.0.0.1, port: $WEIR, enable_http3: true}]
plugins: [proxy-rewrite]
CONF
{ echo "ssls:"; echo "  - id: b"; echo "    snis: [bench.test]"; echo "    cert: |"; indent "$WORK/cert.pem"; echo "    key: |"; indent "$WORK/key.pem"
  echo "routes:"; echo "  - {id: 1, uri: /x, upstream: {nodes: {\"127.0.0.1:$UP\": 1}}}"; } > "$WORK/weir/conf/resources.yaml"
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
weir_pid=$!; PIDS+=($weir_pid)

cat > "$WORK/Caddyfile" <<CONF
{
  admin off
  auto_https off
  servers {
    protocols h1 h2 h3
  }
}
https://bench.test:$CADDY {
  tls $WORK/cert.pem $WORK/key.pem
  reverse_proxy 127.0.0.1:$UP
}
CONF
XDG_DATA_HOME=$WORK XDG_CONFIG_HOME=$WORK taskset -c "$PROXY_CPU" caddy run --config "$WORK/Caddyfile" --adapter caddyfile > "$WORK/caddy.log" 2>&1 &
caddy_pid=$!; PIDS+=($caddy_pid)
for port in $WEIR $CADDY; do
  for _ in $(seq 1 100); do curl -sk -o /dev/null --resolve "bench.test:$port:127.0.0.1" "https://bench.test:$port/x" && break; sleep 0.1; done
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # clock ticks (user + system)
tick=$(getconf CLK_TCK)
report() { # NAME PID REQUESTS TICKS EXTRA
  awk -v n="$1" -v r="$3" -v t="$4" -v hz="$tick" -v d="$DURATION" -v x="$5" \
    'BEGIN { printf "%-14s %9.0f req/s  %s  server CPU %.1f us/request\n", n, r / d, x, (r > 0 ? t / hz * 1e6 / r : 0) }'
}
h3run() { # NAME PID PORT
  local before after out
  before=$(cpu "$2")
  out=$(taskset -c "$LOAD_CPU" "$VENV/bin/python" benches/h3_load.py 127.0.0.1 "$3" bench.test /x "$CONNS" "$STREAMS" "$DURATION")
  after=$(cpu "$2")
  set -- "$1" "$2" "$3" $out
  report "$1" "$2" "$4" $((after - before)) "p50 $5 ms  p99 $6 ms  errors $7"
}
h2run() { # NAME PID PORT
  local before after out reqs p99
  before=$(cpu "$2")
  out=$(taskset -c "$LOAD_CPU" h2load -c "$CONNS" -m "$STREAMS" -D "$DURATION" --connect-to="127.0.0.1:$3" "https://bench.test:$3/x" 2>&1)
  after=$(cpu "$2")
  reqs=$(echo "$out" | awk '/^requests:/ {print $8}')
  p99=$(echo "$out" | awk '/^time for request:/ {print $4 " " $6}')
  report "$1" "$2" "${reqs:-0}" $((after - before)) "mean/sd $p99  $(echo "$out" | awk '/^requests:/ {print $10, $11}')"
}
echo "HTTP/3 clients: $CONNS connections x $STREAMS streams, ${DURATION}s each (aioquic, one process); HTTP/2: h2load, same shape"
h3run "weir h3" "$weir_pid" "$WEIR"
h3run "caddy h3" "$caddy_pid" "$CADDY"
h2run "weir h2" "$weir_pid" "$WEIR"
h2run "caddy h2" "$caddy_pid" "$CADDY"
