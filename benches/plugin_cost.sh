#!/usr/bin/env bash
# What each default plugin costs: user-space instructions per proxied request with the plugin
# alone on the route, against the plain route, counted with callgrind
# (../shared/tools/instr_per_request.sh: repeatable to 0.2 %, whatever else the machine does).
# Prints a Markdown table (docs/data-plane.md quotes it). Plugins that must answer the request
# themselves (redirect, the authentication plugins whose credentials the load client cannot send,
# forward-auth without its service) are not listed: the tool counts proxied 200s only.
#
#   benches/plugin_cost.sh                 # every plugin below (about a minute each)
#   ONLY="key-auth limit-count" benches/plugin_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TOOL=${TOOL:-../shared/tools/instr_per_request.sh}
BIN=${BIN:-target/release/weir}
[ -x "$BIN" ] || cargo build --release
[ -x "$TOOL" ] || { echo "needs $TOOL (and valgrind, nginx)"; exit 1; }
declare -A CONF=(
  [example-plugin]='{"i": 1}'
  [key-auth]='{}'
  [consumer-restriction]='{"whitelist": ["bench"]}'
  [limit-count]='{"count": 1000000000, "time_window": 3600}'
  [limit-count-no-headers]='{"count": 1000000000, "time_window": 3600, "show_limit_quota_header": false}'
  [limit-req]='{"rate": 1000000, "burst": 1000000, "key": "remote_addr"}'
  [limit-conn]='{"conn": 100000, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}'
  [traffic-split]='{"rules": [{"weighted_upstreams": [{"weight": 1}]}]}'
  [fault-injection]='{"delay": {"duration": 0, "percentage": 0}}'
  [api-breaker]='{"break_response_code": 502}'
  [proxy-rewrite]='{"uri": "/rewritten", "headers": {"set": {"X-Bench": "1"}}}'
  [response-rewrite]='{"headers": {"set": {"X-Bench": "1"}}}'
  [gzip]='{}'
  [brotli]='{}'
  [uri-blocker]='{"block_rules": ["^/admin"]}'
  [cors]='{}'
  [request-validation]='{"header_schema": {"type": "object", "required": ["apikey"]}}'
  [request-id]='{}'
  [real-ip]='{"source": "http_x_real_ip"}'
  [file-logger]='{"path": "/dev/null"}'
  [ip-restriction]='{"whitelist": ["127.0.0.0/8"]}'
  [prometheus]='{}'
)
ORDER="example-plugin key-auth consumer-restriction limit-count limit-count-no-headers limit-req limit-conn traffic-split fault-injection api-breaker proxy-rewrite response-rewrite gzip brotli uri-blocker cors request-validation request-id real-ip file-logger ip-restriction prometheus"
measure() { WEIR_BIN="$BIN" "$TOOL" "$1" 2>/dev/null | awk '/instructions per request/ {print $5}'; }
base=$(measure '{}')
echo "| plugin (alone on the route) | instructions per request | over the plain route |"
echo "|---|---:|---:|"
echo "| (none: the plain route) | $base | |"
for name in ${ONLY:-$ORDER}; do
  plugin=${name%-no-headers}
  conf=${CONF[$name]}
  # consumer-restriction needs a consumer: key-auth identifies the load client's.
  if [ "$plugin" = consumer-restriction ]; then json="{\"key-auth\": {}, \"$plugin\": $conf}"; else json="{\"$plugin\": $conf}"; fi
  n=$(measure "$json" || true)
  if [ -z "$n" ]; then echo "| $name | failed | |"; continue; fi
  echo "| $name | $n | +$((n - base)) |"
done
