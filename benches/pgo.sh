#!/usr/bin/env bash
# A profile-guided (PGO) release build of weir: an instrumented build, a training load on the
# paths the benchmarks measure, the merged profile, then the release build that uses it.
#
#   benches/pgo.sh                      # -> target/pgo-use/release/weir
#   PGO_SECONDS=4 benches/pgo.sh        # seconds per training load (default 6)
#
# Needs: wrk, h2load, nginx (the upstream), openssl, and llvm-profdata of rustc's own LLVM
# (`rustup component add llvm-tools`). The two builds use their own target directories
# (target/pgo-gen, target/pgo-use) because RUSTFLAGS differ, so the plain release build in
# target/release is left alone. Each is a full fat-LTO build the first time: 10-15 minutes
# apiece on 2 cores. The merged profile is named after its hash (target/pgo-use/weir-*.profdata):
# cargo does not track a profile's contents, so a new profile must change RUSTFLAGS to be used.
#
# The training load: HTTP/1.1 keep-alive through a plain route and through key-auth +
# limit-count + proxy-rewrite, HTTPS keep-alive, full TLS handshakes, HTTP/2 over TLS and h2c.
# The profile only steers code layout, inlining and branch order; a path it did not see is
# built as without PGO, never left out. See docs/data-plane.md, "Profile-guided builds".
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${PGO_SECONDS:-6}
for tool in wrk h2load nginx openssl; do
  command -v "$tool" >/dev/null || { echo "$tool is required for the training load"; exit 1; }
done
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | awk '/^host:/ {print $2}')/bin/llvm-profdata"
[ -x "$PROFDATA" ] || { echo "no $PROFDATA: rustup component add llvm-tools"; exit 1; }

WORK=$(mktemp -d /tmp/weir-pgo.XXXXXX)
chmod 755 "$WORK"   # nginx workers (nobody) must read the files served
# A fixed path: it is part of RUSTFLAGS, so a second run reuses the instrumented build.
RAW="$PWD/target/pgo-gen/profraw"
cleanup() {
  [ -f "$WORK/up/nginx.pid" ] && kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true
  [ -n "${WEIR_PID:-}" ] && kill "$WEIR_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== 1/4 instrumented build (target/pgo-gen)"
RUSTFLAGS="-Cprofile-generate=$RAW" CARGO_TARGET_DIR=target/pgo-gen cargo build --release --bin weir

echo "== 2/4 training load, ${SECONDS_EACH}s per path"
rm -rf "$RAW"
. benches/lib.sh
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
UP=$(port) PLAIN=$(port) TLS=$(port) H2C=$(port) CTL=$(port) PROM=$(port)
nginx_upstream "$WORK/up" "$UP"
mkdir -p "$WORK/weir/conf"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -keyout "$WORK/weir/conf/t.key" -out "$WORK/weir/conf/t.crt" -subj "/CN=pgo.test" \
  -addext "subjectAltName=DNS:pgo.test,IP:127.0.0.1" 2>/dev/null
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen:
    - {ip: 127.0.0.1, port: $PLAIN}
    - {ip: 127.0.0.1, port: $H2C, enable_http2: true}
  ssl:
    listen: [{ip: 127.0.0.1, port: $TLS}]
    fallback_sni: pgo.test
  worker_processes: 1
  control: {port: $CTL}
plugin_attr: {prometheus: {export_addr: {ip: 127.0.0.1, port: $PROM}}}
CONF
cat > "$WORK/weir/conf/resources.yaml" <<CONF
upstreams:
  - {id: 1, nodes: {"127.0.0.1:$UP": 1}}
consumers:
  - {username: pgo, plugins: {key-auth: {key: pgo-key}}}
routes:
  - {id: plain, uri: /plain, upstream_id: 1}
  - id: plugins
    uri: /plugins
    upstream_id: 1
    plugins:
      key-auth: {}
      limit-count: {count: 1000000000, time_window: 60}
      proxy-rewrite: {uri: /1k, headers: {set: {x-pgo: "1"}}}
ssls:
  - {id: t, snis: [pgo.test], cert_file: conf/t.crt, key_file: conf/t.key}
CONF
./target/pgo-gen/release/weir -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
WEIR_PID=$!
up=
for _ in $(seq 1 200); do curl -s -o /dev/null "127.0.0.1:$PLAIN/plain" && { up=1; break; }; sleep 0.05; done
[ -n "$up" ] || { echo "the instrumented weir did not start:"; cat "$WORK/weir.log"; exit 1; }
d="${SECONDS_EACH}s"
wrk -t1 -c16 -d"$d" "http://127.0.0.1:$PLAIN/plain" | grep -E 'Requests/sec|Non-2xx' || true
wrk -t1 -c16 -d"$d" -H 'apikey: pgo-key' "http://127.0.0.1:$PLAIN/plugins" | grep -E 'Requests/sec|Non-2xx' || true
wrk -t1 -c16 -d"$d" "https://127.0.0.1:$TLS/plain" | grep -E 'Requests/sec|Non-2xx' || true
wrk -t1 -c16 -d"$d" -H 'Connection: close' "https://127.0.0.1:$TLS/plain" | grep -E 'Requests/sec|Non-2xx' || true
h2load -c16 -m10 -D"$SECONDS_EACH" "https://127.0.0.1:$TLS/plain" | grep -E '^(finished|status codes)' || true
h2load -c4 -m10 -D"$SECONDS_EACH" "http://127.0.0.1:$H2C/plain" | grep -E '^(finished|status codes)' || true
# A graceful stop returns from main, where the profile runtime writes its file.
kill -TERM "$WEIR_PID"; wait "$WEIR_PID" || true; WEIR_PID=
ls "$RAW"/*.profraw >/dev/null 2>&1 || { echo "the instrumented weir wrote no profile"; exit 1; }

echo "== 3/4 merging the profile"
mkdir -p target/pgo-use
"$PROFDATA" merge -o "$WORK/merged.profdata" "$RAW"
OUT="$PWD/target/pgo-use/weir-$(sha256sum "$WORK/merged.profdata" | cut -c1-12).profdata"
mv "$WORK/merged.profdata" "$OUT"

echo "== 4/4 release build with the profile (target/pgo-use)"
RUSTFLAGS="-Cprofile-use=$OUT" CARGO_TARGET_DIR=target/pgo-use cargo build --release --bin weir
echo "built target/pgo-use/release/weir (profile $OUT)"
