#!/usr/bin/env bash
# User-space instructions per proxied HTTP/2 request, Weir vs nginx, counted with callgrind (the
# HTTP/2 counterpart of ../shared/tools/instr_per_request.sh, repeatable to about 0.5 %).
#
#   benches/instr_per_h2_request.sh          # needs: valgrind, nginx (http_v2), h2load
#   BIN=... CALLGRIND_OUT=/tmp/cg benches/instr_per_h2_request.sh
#   TLS=1 benches/instr_per_h2_request.sh    # over TLS 1.3 (ALPN h2), ECDSA P-256; needs openssl
#   CONNS=16 benches/instr_per_h2_request.sh # connections (default 4), 10 streams each
#
# Cleartext HTTP/2 with prior knowledge by default (the HTTP/2 server alone, not rustls),
# h2load with 4 connections x 10 concurrent streams, a 1 KiB answer from an nginx upstream over
# keep-alive HTTP/1.1. Each proxy runs twice under callgrind, serving N1 and N2 requests after
# the same warm-up; the difference divided by N2 - N1 is the per-request figure, so start-up
# and the warm-up cancel out.
set -u
cd "$(dirname "$0")/.."
bin=$(readlink -f "${BIN:-target/release/weir}")
[ -x "$bin" ] || { echo "no $bin (cargo build --release)"; exit 1; }
for tool in valgrind nginx h2load; do
  command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }
done
w=$(mktemp -d /tmp/ipr-h2.XXXX)
trap 'kill $(jobs -p) 2>/dev/null; sleep 0.3; rm -rf "$w"' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
UP=$(port)
body=$(head -c 1024 /dev/zero | tr '\0' 'x')
mkdir -p "$w/up" "$w/ng" "$w/weir/conf"
scheme=http ng_ssl="" weir_ssl=""
if [ -n "${TLS:-}" ]; then
  scheme=https
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -keyout "$w/k.pem" \
    -out "$w/c.pem" -subj "/CN=bench.test" -addext "subjectAltName=DNS:bench.test,IP:127.0.0.1" 2>/dev/null
  cp "$w/k.pem" "$w/c.pem" "$w/weir/conf/"
  ng_ssl="ssl_certificate $w/c.pem; ssl_certificate_key $w/k.pem; ssl_protocols TLSv1.3;"
  weir_ssl=", \"ssls\": [{\"id\": \"b\", \"snis\": [\"bench.test\"], \"cert_file\": \"conf/c.pem\", \"key_file\": \"conf/k.pem\"}]"
fi
cat > "$w/up/nginx.conf" <<C
worker_processes 1; daemon off; pid $w/up/pid; error_log $w/up/err.log;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$UP; location / { return 200 "$body"; } } }
C
nginx -p "$w/up" -c "$w/up/nginx.conf" 2>/dev/null &
wait_port() { for _ in $(seq 300); do python3 -c "import socket;socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0; sleep 0.2; done; return 1; }
load() { # port count: exits non-zero unless every request succeeded
  local out; out=$(h2load -c"${CONNS:-4}" -m10 -n "$2" "$scheme://127.0.0.1:$1/x" 2>&1)
  grep -q "^status codes: $2 2xx" <<<"$out" || { echo "$out" >&2; return 1; }
}
total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
measure() { # name n -> prints total instructions
  local name=$1 n=$2 p; p=$(port)
  if [ "$name" = nginx ]; then
    cat > "$w/ng/nginx.conf" <<C
worker_processes 1; master_process off; daemon off; pid $w/ng/pid; error_log $w/ng/err.log;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  upstream u { server 127.0.0.1:$UP; keepalive 64; }
  server { listen 127.0.0.1:$p ${TLS:+ssl} http2; http2_max_concurrent_streams 128; $ng_ssl
    location / { proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
C
    valgrind --tool=callgrind --callgrind-out-file="$w/cg.$name.$n" nginx -p "$w/ng" -c "$w/ng/nginx.conf" >/dev/null 2>&1 &
  else
    local c; c=$(port)
    local listen="\"node_listen\": [{\"ip\": \"127.0.0.1\", \"port\": $p, \"enable_http2\": true}]"
    [ -n "${TLS:-}" ] && listen="\"node_listen\": [{\"ip\": \"127.0.0.1\", \"port\": $(port)}], \"ssl\": {\"listen\": [{\"ip\": \"127.0.0.1\", \"port\": $p}], \"fallback_sni\": \"bench.test\"}"
    echo "{\"gateway\": {$listen, \"worker_processes\": 1, \"control\": {\"port\": $c}}}" > "$w/weir/conf/config.yaml"
    echo "{\"routes\": [{\"id\": 1, \"uri\": \"/*\", \"upstream\": {\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$UP\": 1}}}]$weir_ssl}" > "$w/weir/conf/resources.yaml"
    (cd "$w/weir" && RUST_LOG=error exec valgrind --tool=callgrind --callgrind-out-file="$w/cg.$name.$n" "$bin" -p "$w/weir" >/dev/null 2>&1) &
  fi
  local pid=$!
  wait_port "$p" || { echo "$name did not start" >&2; return 1; }
  load "$p" 400 || { echo "$name did not answer 200" >&2; return 1; }
  load "$p" "$n" || { echo "$name answered non-200" >&2; return 1; }
  if [ "$name" = nginx ]; then kill -QUIT $pid; else kill -TERM $(pgrep -P $pid || echo $pid) 2>/dev/null; kill -TERM $pid 2>/dev/null; fi
  wait $pid 2>/dev/null
  total "$w/cg.$name.$n"
}
N1=${N1:-2000}; N2=${N2:-6000}
for name in weir nginx; do
  a=$(measure $name "$N1") || exit 1; b=$(measure $name "$N2") || exit 1
  eval "per_$name=\$(( (b - a) / (N2 - N1) ))"
  echo "$name: $a instructions at $N1 requests, $b at $N2"
done
[ -n "${CALLGRIND_OUT:-}" ] && mkdir -p "$CALLGRIND_OUT" && cp "$w"/cg.* "$CALLGRIND_OUT"/
python3 -c "import sys; w,n=int(sys.argv[1]),int(sys.argv[2]); t=' over TLS' if sys.argv[3] else ''; print(f'HTTP/2{t} instructions per request: weir {w} nginx {n} ratio {w/n:.2f}')" "$per_weir" "$per_nginx" "${TLS:-}"
