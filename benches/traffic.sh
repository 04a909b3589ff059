#!/usr/bin/env bash
# The traffic plugins' cost on the request path, in user-space instructions per proxied request
# (../shared/tools/instr_per_request.sh, callgrind; repeatable to 0.2 %), next to the plain route:
#  - traffic-split with a rule of three conditions (==, a regex, in) over request headers that
#    hold, choosing between two weighted upstreams (an inline one and the route's own, 1:1);
#  - the same rule when it does not hold (the route's own upstream);
#  - api-breaker, closed (its open check and the status count);
#  - fault-injection whose vars do not hold (the common case of a chaos rule).
# Target: traffic-split <= 1.1x the plain route. Every scenario proxies to the same nginx.
#
#   benches/traffic.sh            # needs: valgrind, nginx, python3, a release build
#   BIN=/path/to/weir benches/traffic.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/weir}
TOOL=${INSTR_TOOL:-../shared/tools/instr_per_request.sh}
[ -x "$BIN" ] || cargo build --release
[ -r "$TOOL" ] || { echo "no $TOOL"; exit 1; }
WORK=$(mktemp -d /tmp/weir-traffic-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The measuring script, with per-scenario request headers, and `__UP__` in the plugins replaced
# by its upstream's address (an inline upstream names the same nginx as the route).
variant="$WORK/instr.sh"
sed -e 's|headers={"apikey": "bench-key"}|headers=__import__("json").loads(__import__("os").environ["BENCH_HEADERS"])|' \
    -e 's|^UP=\$(port)$|UP=$(port); plugins=${plugins//__UP__/127.0.0.1:$UP}|' \
    "$TOOL" > "$variant"
grep -q BENCH_HEADERS "$variant" && grep -q '__UP__' "$variant" || { echo "the measuring script changed shape"; exit 1; }

RULE='"match": [{"vars": [["http_x-env", "==", "canary"], ["http_x-user", "~~", "^[a-z]+[0-9]*$"], ["http_x-tier", "in", ["gold", "silver"]]]}]'
SPLIT="{\"traffic-split\": {\"rules\": [{$RULE, \"weighted_upstreams\": [{\"upstream\": {\"nodes\": {\"__UP__\": 1}}, \"weight\": 1}, {\"weight\": 1}]}]}}"
HOLDS='{"x-env": "canary", "x-user": "ann42", "x-tier": "gold"}'
MISSES='{"x-env": "stable", "x-user": "ann42", "x-tier": "gold"}'
scenario() { # name -> "plugins<TAB>headers"
  case $1 in
    plain) printf '%s\t%s\n' '{}' "$HOLDS" ;;
    traffic-split) printf '%s\t%s\n' "$SPLIT" "$HOLDS" ;;
    traffic-split-miss) printf '%s\t%s\n' "$SPLIT" "$MISSES" ;;
    api-breaker) printf '%s\t%s\n' '{"api-breaker": {"break_response_code": 502}}' "$HOLDS" ;;
    fault-injection) printf '%s\t%s\n' '{"fault-injection": {"abort": {"http_status": 503, "vars": [[["http_x-chaos", "==", "1"]]]}}}' "$HOLDS" ;;
  esac
}
SCENARIOS=(${SCENARIOS:-plain traffic-split traffic-split-miss api-breaker fault-injection})

echo "instructions per proxied request (callgrind):"
declare -A INSTR
for s in "${SCENARIOS[@]}"; do
  IFS=$'\t' read -r plugins headers < <(scenario "$s")
  line=$(BENCH_HEADERS="$headers" WEIR_BIN="$BIN" bash "$variant" "$plugins" | tail -1)
  printf '  %-20s %s\n' "$s" "$line"
  INSTR[$s]=$(echo "$line" | awk '{print $5}')
done
echo
printf '| %-20s | %14s | %9s |\n' route "instr/request" "vs plain"
printf '|%s|%s|%s|\n' ---------------------- ---------------- -----------
for s in "${SCENARIOS[@]}"; do
  v=${INSTR[$s]:-}
  ratio=$(python3 -c "import sys; a,b=sys.argv[1],sys.argv[2]; print(f'{int(a)/int(b):.3f}x' if a and b else '-')" "$v" "${INSTR[plain]:-}")
  printf '| %-20s | %14s | %9s |\n' "$s" "$v" "$ratio"
done
