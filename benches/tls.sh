#!/usr/bin/env bash
# TLS and HTTP/2 benchmark: Weir vs nginx with the same ECDSA P-256 certificate, both on one
# pinned core (worker_processes 1), the load tool and the upstream on the other core. Both proxy
# to the same upstream (nginx answering 1 KiB) over keep-alive HTTP/1.1.
#
#   benches/tls.sh                    # needs: wrk, h2load, nginx, openssl
#                                     #   (apt-get install wrk nghttp2-client nginx-light openssl)
#   DURATION=10 ROUNDS=3 benches/tls.sh
#   SCENARIOS=handshake BIN=... benches/tls.sh   # some scenarios only (e.g. to compare builds)
#
# Scenarios, alternating weir / nginx each round:
#   https      wrk, 16 keep-alive connections over TLS 1.3 (HTTP/1.1)
#   handshake  wrk with `Connection: close`: one full TLS handshake per request
#   h2         h2load, 16 connections x 10 concurrent streams, TLS + ALPN h2
# Output: one line per run (req/s, and the proxy's CPU time per request), then medians, the
# weir/nginx req/s ratios and the nginx/weir CPU-per-request ratios (targets: >= 1.0 each).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-tls-bench.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
UP_PORT=18280; NGINX_PORT=18281; WEIR_PORT=18282; WEIR_PLAIN=18283; CTL_PORT=18290

[ -x "$BIN" ] || cargo build --release
for tool in wrk h2load nginx openssl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (see the header of $0)"; exit 1; }
done

cleanup() {
  [ -f "$WORK/up/nginx.pid" ] && kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true
  [ -f "$WORK/peer/nginx.pid" ] && kill "$(cat "$WORK/peer/nginx.pid")" 2>/dev/null || true
  [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/up" "$WORK/peer" "$WORK/weir/conf"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -keyout "$WORK/bench.key" -out "$WORK/bench.crt" -subj "/CN=bench.test" \
  -addext "subjectAltName=DNS:bench.test,IP:127.0.0.1" 2>/dev/null

head -c 1024 /dev/zero | tr '\0' 'x' > "$WORK/up/1k"
cat > "$WORK/up/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/up/nginx.pid;
error_log $WORK/up/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UP_PORT; location / { root $WORK/up; try_files /1k =404; } }
}
CONF
taskset -c "$LOAD_CPU" nginx -c "$WORK/up/nginx.conf" -p "$WORK/up"

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
    listen 127.0.0.1:$NGINX_PORT ssl http2;
    ssl_certificate $WORK/bench.crt;
    ssl_certificate_key $WORK/bench.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    # Like for like: the suite order Weir's listeners use (AES-128-GCM first, theirs decides).
    ssl_prefer_server_ciphers on;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;
    ssl_session_cache shared:SSL:10m;
    http2_max_concurrent_streams 128;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF
taskset -c "$PROXY_CPU" nginx -c "$WORK/peer/nginx.conf" -p "$WORK/peer"

cp "$WORK/bench.crt" "$WORK/bench.key" "$WORK/weir/conf/"
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PLAIN}]
  ssl:
    listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
    fallback_sni: bench.test
  worker_processes: 1
  control: {port: $CTL_PORT}
# Not the exporter's default 9091, which a gateway already running here may hold.
plugin_attr: {prometheus: {export_addr: {ip: 127.0.0.1, port: 18291}}}
CONF
cat > "$WORK/weir/conf/resources.yaml" <<CONF
upstreams:
  - {id: 1, nodes: {"127.0.0.1:$UP_PORT": 1}}
routes:
  - {id: bench, uri: /bench, upstream_id: 1}
ssls:
  - {id: bench, snis: [bench.test], cert_file: conf/bench.crt, key_file: conf/bench.key}
CONF

start_weir() {
  taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
  WEIR_PID=$!
  for _ in $(seq 1 200); do
    curl -sk -o /dev/null "https://127.0.0.1:$WEIR_PORT/bench" && return 0
    sleep 0.05
  done
  echo "weir did not start:"; cat "$WORK/weir.log"; exit 1
}
stop_weir() { kill "$WEIR_PID"; wait "$WEIR_PID" 2>/dev/null || true; WEIR_PID=; }

# run NAME PORT SCENARIO PID -> "NAME-SCENARIO req/s cpu-us-per-request" (PID: the proxy's
# serving process, whose CPU time per request repeats far better than req/s on a shared machine)
run() {
  local name=$1 port=$2 scenario=$3 pid=$4 out rps n before after
  local url="https://127.0.0.1:$port/bench"
  before=$(cpu_ticks "$pid")
  local p0 l0; p0=$(core_ticks "$PROXY_CPU"); l0=$(core_ticks "$LOAD_CPU")
  case $scenario in
    https) out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" "$url")
           rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out"); n=$(awk '/requests in/ {print $1}' <<<"$out") ;;
    handshake) out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -H "Connection: close" "$url")
           rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out"); n=$(awk '/requests in/ {print $1}' <<<"$out") ;;
    h2) out=$(taskset -c "$LOAD_CPU" h2load -c"$CONNS" -m10 -D"$DURATION" --warm-up-time=1 "$url" 2>&1)
        rps=$(awk '/^finished in/ {gsub(",", "", $4); print $4}' <<<"$out")
        # CPU time includes the 1 s warm-up, whose requests h2load does not count: at the same rate.
        n=$(awk -v r="${rps:-0}" -v d="$DURATION" 'BEGIN {printf "%d", r * (d + 1)}')
        local failed; failed=$(awk '/^requests:/ {print $10}' <<<"$out")
        [ "${failed:-0}" = "0" ] || echo "  ($name h2: $failed failed requests)" >&2 ;;
  esac
  after=$(cpu_ticks "$pid")
  local p1 l1; p1=$(core_ticks "$PROXY_CPU"); l1=$(core_ticks "$LOAD_CPU")
  echo "$name-$scenario ${rps:-0} $(us_per $((after - before)) "${n:-0}") $(busy_pct "$p0" "$p1") $(busy_pct "$l0" "$l1")"
}

RESULTS="$WORK/results"
: > "$RESULTS"
[ "$(curl -skf "https://127.0.0.1:$NGINX_PORT/bench" | wc -c)" = 1024 ] || { echo "nginx peer does not answer 200 with 1 KiB"; cat "$WORK/peer/error.log"; exit 1; }
start_weir
NGINX_WORKER=$(pgrep -P "$(cat "$WORK/peer/nginx.pid")" | head -1)
for round in $(seq 1 "$ROUNDS"); do
  for scenario in ${SCENARIOS:-https handshake h2}; do
    run weir "$WEIR_PORT" "$scenario" "$WEIR_PID" | tee -a "$RESULTS"
    run nginx "$NGINX_PORT" "$scenario" "$NGINX_WORKER" | tee -a "$RESULTS"
  done
done
stop_weir

echo
echo "median of $ROUNDS rounds, ${DURATION}s each, $CONNS connections, proxy on cpu $PROXY_CPU, load+upstream on cpu $LOAD_CPU"
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows, cpu, load = {}, {}, {}
for line in open(sys.argv[1]):
    name, rps, us, _pcore, lcore = line.split()
    rows.setdefault(name, []).append(float(rps))
    cpu.setdefault(name, []).append(float(us))
    load.setdefault(name, []).append(float(lcore))
med = {k: statistics.median(v) for k, v in rows.items()}
mcpu = {k: statistics.median(v) for k, v in cpu.items()}
mload = {k: statistics.median(v) for k, v in load.items()}
print(f"{'scenario':12} {'weir req/s':>11} {'nginx req/s':>12} {'weir/nginx':>11}   {'CPU us/req weir':>16} {'nginx':>6} {'nginx/weir':>11}"
      f"   {'load core weir':>14} {'nginx':>6}")
for s in ("https", "handshake", "h2"):
    w, n = med.get(f"weir-{s}", 0), med.get(f"nginx-{s}", 0)
    cw, cn = mcpu.get(f"weir-{s}", 0), mcpu.get(f"nginx-{s}", 0)
    lw, ln = mload.get(f"weir-{s}", 0), mload.get(f"nginx-{s}", 0)
    print(f"{s:12} {w:11.0f} {n:12.0f} {(w / n if n else 0):11.3f}   {cw:16.1f} {cn:6.1f} {(cn / cw if cw else 0):11.3f}"
          f"   {lw:13.0f}% {ln:5.0f}%")
print("(targets >= 1.00; a load core near 100 % busy capped that run's req/s, whatever the proxy did)")
PY
