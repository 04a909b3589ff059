#!/usr/bin/env bash
# Runs schemathesis against a real instance (etcd provider, Admin API on) for every operation of
# docs/openapi.json: no 5xx, and every response conforms to the document (status, content type,
# headers, body schema).
#
#   .ci/schemathesis.sh [path/to/weir]     # needs etcd and schemathesis (`st`) on PATH
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-${CARGO_TARGET_DIR:-target}/debug/weir}
[ -x "$BIN" ] || { echo "no weir binary at $BIN (cargo build first)"; exit 1; }
ST=${ST:-st}
EXAMPLES=${ST_EXAMPLES:-10}
WORK=$(mktemp -d /tmp/weir-schemathesis.XXXXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ETCD=$(port); PEER=$(port); NODE=$(port); CONTROL=$(port); ADMIN=$(port)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

. benches/lib.sh
etcd_single "$WORK" st "$ETCD" "$PEER"
PIDS+=("$ETCD_PID")
mkdir -p "$WORK/weir/conf"
cat >"$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $NODE}]
  ssl: {enable: false}
  worker_processes: 1
  control: {port: $CONTROL}
deployment:
  config_provider: etcd
  etcd: {host: ["http://127.0.0.1:$ETCD"], timeout: 5}
  admin:
    admin_listen: {ip: 127.0.0.1, port: $ADMIN}
    admin_key: [{name: st, key: schemathesis-admin-key, role: admin}]
CONF
"$BIN" -p "$WORK/weir" >"$WORK/weir.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 200); do curl -s -o /dev/null "127.0.0.1:$ADMIN/" && curl -s -o /dev/null "127.0.0.1:$CONTROL/" && break; sleep 0.1; done
if ! curl -s -o /dev/null "127.0.0.1:$ADMIN/"; then
  echo "weir did not start; its log:"; cat "$WORK/weir.log"; exit 1
fi

# Something to report: the control API's dumps are then checked with content, not only as [].
admin() { curl -sf -X PUT "127.0.0.1:$ADMIN/weir/admin/$1" -H 'X-API-KEY: schemathesis-admin-key' -d "$2" >/dev/null; }
admin upstreams/u1 "{\"nodes\": {\"127.0.0.1:$NODE\": 1}, \"checks\": {\"active\": {\"http_path\": \"/\"}}}"
admin services/s1 '{"upstream_id": "u1", "plugins": {"request-id": {}}}'
admin routes/r1 '{"uri": "/a/*", "service_id": "s1", "plugins": {"limit-count": {"count": 10, "time_window": 60}}}'
admin consumers '{"username": "jack", "plugins": {"key-auth": {"key": "jack-key"}}}'
admin plugin_metadata/example-plugin '{"skey": "s", "ikey": 1}'
for _ in $(seq 1 50); do [[ "$(curl -s "127.0.0.1:$CONTROL/v1/routes")" == *r1* ]] && break; sleep 0.1; done

checks=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance
status=0
echo "== control API (127.0.0.1:$CONTROL)"
"$ST" run docs/openapi.json --url "http://127.0.0.1:$CONTROL" --include-path-regex '^/v1/' \
  --checks "$checks" --max-examples "$EXAMPLES" --seed 1 --request-timeout 10 \
  --suppress-health-check all || status=1
echo "== Admin API (127.0.0.1:$ADMIN)"
"$ST" run docs/openapi.json --url "http://127.0.0.1:$ADMIN" --include-path-regex '^/weir/admin/' \
  -H "X-API-KEY: schemathesis-admin-key" \
  --checks "$checks" --max-examples "$EXAMPLES" --seed 1 --request-timeout 10 \
  --suppress-health-check all || status=1
if [ "$status" != 0 ]; then
  cp "$WORK/weir.log" "${TMPDIR:-/tmp}/weir-schemathesis.log"
  echo "--- weir log: ${TMPDIR:-/tmp}/weir-schemathesis.log; its errors:"
  grep -E "panicked|ERROR" "$WORK/weir.log" | head -n 20 || true
fi
exit "$status"
