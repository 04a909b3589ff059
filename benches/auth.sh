#!/usr/bin/env bash
# Authentication plugins, each alone on the same route, consumer and upstream:
#  1. user-space instructions per proxied request (../shared/tools/instr_per_request.sh,
#     callgrind; repeatable to 0.2 %), next to the plain route;
#  2. wrk req/s (one pinned core each for Weir and for wrk + the upstream), as a ratio to
#     key-auth, rounds alternating between plugins so that drift affects all alike.
# Credentials and tokens are made fresh by benches/auth_tokens.py (Python + openssl); the
# openid-connect bearer_only route verifies against a discovery document and JWKS it serves.
#
#   benches/auth.sh                      # needs: valgrind, wrk, nginx, a release build
#   DURATION=8 ROUNDS=3 SKIP_INSTR=1 benches/auth.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
TOOL=${INSTR_TOOL:-../shared/tools/instr_per_request.sh}
[ -x "$BIN" ] || cargo build --release
WORK=$(mktemp -d /tmp/weir-auth-bench.XXXXXX)
chmod 755 "$WORK"
PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

python3 benches/auth_tokens.py "$WORK/creds"
OIDC_PORT=$(port)
python3 benches/auth_tokens.py serve "$WORK/creds" "$OIDC_PORT" &
PIDS+=($!)
OIDC_TOKEN=$(python3 benches/auth_tokens.py oidc-token "$WORK/creds" "$OIDC_PORT")
CREDS="$WORK/creds/creds.json"
consumers=$(python3 -c 'import json,sys;print(json.dumps(json.load(open(sys.argv[1]))["consumers"]))' "$CREDS")
headers_of() { # scenario -> JSON object of request headers
  case $1 in
    plain) echo '{}' ;;
    openid-connect) echo "{\"authorization\": \"Bearer $OIDC_TOKEN\"}" ;;
    *) python3 -c 'import json,sys;print(json.dumps(json.load(open(sys.argv[1]))["headers"][sys.argv[2]]))' "$CREDS" "$1" ;;
  esac
}
plugins_of() { # scenario -> route plugins JSON
  case $1 in
    plain) echo '{}' ;;
    jwt-*) echo '{"jwt-auth": {}}' ;;
    hmac-auth) echo '{"hmac-auth": {"clock_skew": 86400}}' ;;
    openid-connect) echo "{\"openid-connect\": {\"client_id\": \"bench\", \"client_secret\": \"bench-secret\", \"discovery\": \"http://127.0.0.1:$OIDC_PORT/.well-known/openid-configuration\", \"bearer_only\": true, \"set_userinfo_header\": false}}" ;;
    *) echo "{\"$1\": {}}" ;;
  esac
}
SCENARIOS=(plain key-auth basic-auth jwt-hs256 jwt-rs256 jwt-es256 hmac-auth openid-connect)

# --- 1. instructions per request ------------------------------------------------------------------
if [ -z "${SKIP_INSTR:-}" ]; then
  [ -r "$TOOL" ] || { echo "no $TOOL"; exit 1; }
  variant="$WORK/instr.sh"
  # The measuring script, with this benchmark's consumers and per-scenario request headers.
  sed -e 's|\\"consumers\\": \[{\\"username\\": \\"bench\\", \\"plugins\\": {\\"key-auth\\": {\\"key\\": \\"bench-key\\"}}}\]|\\"consumers\\": $BENCH_CONSUMERS|' \
      -e 's|headers={"apikey": "bench-key"}|headers=__import__("json").loads(__import__("os").environ["BENCH_HEADERS"])|' \
      "$TOOL" > "$variant"
  grep -q BENCH_CONSUMERS "$variant" && grep -q BENCH_HEADERS "$variant" || { echo "the measuring script changed shape"; exit 1; }
  echo "instructions per proxied request (callgrind):"
  for s in "${SCENARIOS[@]}"; do
    line=$(BENCH_CONSUMERS="$consumers" BENCH_HEADERS="$(headers_of "$s")" WEIR_BIN="$BIN" bash "$variant" "$(plugins_of "$s")" | tail -1)
    printf '  %-16s %s\n' "$s" "$line"
    eval "INSTR_${s//-/_}=\$(echo \"\$line\" | awk '{print \$5}')"
  done
fi

# --- 2. wrk -----------------------------------------------------------------------------------------
UP_PORT=$(port); WEIR_PORT=$(port); CTL_PORT=$(port)
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"
mkdir -p "$WORK/weir/conf"
cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  worker_processes: 1
  control: {port: $CTL_PORT}
CONF
# One route per scenario, /<scenario>/*, with that scenario's plugins.
route_args=()
for s in "${SCENARIOS[@]}"; do route_args+=("$s" "$(plugins_of "$s")"); done
python3 - "$WORK/weir/conf/resources.yaml" "$UP_PORT" "$consumers" "${route_args[@]}" <<'P'
import json, sys
path, up, consumers, rest = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
routes = [{"id": s, "uri": f"/{s}/*", "upstream": {"nodes": {f"127.0.0.1:{up}": 1}}, "plugins": json.loads(p)}
          for s, p in zip(rest[0::2], rest[1::2])]
json.dump({"consumers": consumers, "routes": routes}, open(path, "w"))
P
RUST_LOG=warn taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$WEIR_PORT/" && break; sleep 0.1; done
wrk_with() { # scenario -> req/s
  local args=() k v
  local which=$1; [ "$1" = hmac-auth ] && which=hmac-auth-wrk
  while IFS=$'\t' read -r k v; do args+=(-H "$k: $v"); done < <(python3 -c 'import json,sys;[print(f"{k}\t{v}") for k,v in json.loads(sys.argv[1]).items()]' "$(headers_of "$which")")
  local code; code=$(curl -s -o /dev/null -w '%{http_code}' "${args[@]}" "127.0.0.1:$WEIR_PORT/$1/x")
  [ "$code" = 200 ] || { echo "$1 answered $code: $(tail -3 "$WORK/weir.log")" >&2; echo 0; return; }
  local out; out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" "${args[@]}" "http://127.0.0.1:$WEIR_PORT/$1/x")
  if echo "$out" | grep -qE 'Non-2xx|Socket errors'; then echo "$out" >&2; fi
  echo "$out" | awk '/Requests\/sec/ {print $2}'
}
declare -A RUNS
for round in $(seq "$ROUNDS"); do
  for s in "${SCENARIOS[@]}"; do
    r=$(wrk_with "$s"); RUNS[$s]="${RUNS[$s]:-} $r"
    echo "round $round $s: $r req/s"
  done
done
KEY=$(median ${RUNS[key-auth]})
echo
printf '| %-16s | %12s | %10s | %18s |\n' scenario "req/s (med)" "vs key-auth" "instr/request"
printf '|%s|%s|%s|%s|\n' ------------------ -------------- ------------ --------------------
for s in "${SCENARIOS[@]}"; do
  m=$(median ${RUNS[$s]}); v="INSTR_${s//-/_}"
  printf '| %-16s | %12s | %10s | %18s |\n' "$s" "$m" "$(python3 -c "print(f'{$m/$KEY:.2f}x')")" "${!v:-}"
done
