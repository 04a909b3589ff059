#!/usr/bin/env bash
# Zero-downtime binary upgrade under load (issue 27): wrk keeps 32 keep-alive connections busy
# on a route to an nginx upstream while the running Weir is sent SIGUSR2 twice; reported: wrk's
# socket errors and non-2xx answers (target 0) and how long each old process takes to exit
# after SIGUSR2 (the new process's start, then the drain: no long-lived connection is open).
#
#   benches/upgrade.sh            # needs: wrk, nginx, curl
#   DURATION=12 CONNS=32 benches/upgrade.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-12}
CONNS=${CONNS:-32}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-upgrade.XXXXXX)
chmod 755 "$WORK"
UP_PORT=18580
NODE_PORT=18581
CTL_PORT=18582
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx curl; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
. benches/lib.sh
trap 'for p in $(grep -o "started the new process ([0-9]*)" "$WORK/gw/weir.log" 2>/dev/null | grep -o "[0-9]*"); do kill "$p" 2>/dev/null || true; done; bench_cleanup' EXIT
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"

dir="$WORK/gw"
mkdir -p "$dir/conf"
printf 'gateway:\n  node_listen: [{ip: 127.0.0.1, port: %s}]\n  ssl: {enable: false}\n  worker_processes: 1\n  control: {port: %s}\nplugins: [proxy-rewrite]\n' \
  "$NODE_PORT" "$CTL_PORT" > "$dir/conf/config.yaml"
printf 'routes:\n  - {id: 1, uri: /x, upstream: {nodes: {"127.0.0.1:%s": 1}}}\n' "$UP_PORT" > "$dir/conf/resources.yaml"
"$BIN" -p "$dir" > "$dir/weir.log" 2>&1 &
first=$!
PIDS+=($first)
for _ in $(seq 1 100); do curl -s -o /dev/null "127.0.0.1:$NODE_PORT/x" && break; sleep 0.1; done

taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$NODE_PORT/x" > "$WORK/wrk.out" &
wrk_pid=$!

# upgrade PID N: SIGUSR2 to PID; waits for the Nth successor to serve, then for PID to exit.
upgrade() {
  local pid=$1 n=$2 new t0 t1
  sleep $((DURATION / 3))
  t0=$(date +%s.%N)
  kill -USR2 "$pid"
  for _ in $(seq 1 2000); do
    new=$(grep -o "started the new process ([0-9]*)" "$dir/weir.log" | sed -n "${n}p" | grep -o "[0-9]*" || true)
    [ -n "$new" ] && grep -q "previous process ($pid) drains" "$dir/weir.log" && break
    sleep 0.005
  done
  while kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; do sleep 0.01; done
  t1=$(date +%s.%N)
  echo "upgrade $n: new process $new; old process $pid exited $(echo "$t1 - $t0" | bc) s after SIGUSR2" >&2
  echo "$new"
}
second=$(upgrade "$first" 1)
third=$(upgrade "$second" 2)
wait "$wrk_pid"
cat "$WORK/wrk.out"
errors=$(grep -E 'Socket errors|Non-2xx' "$WORK/wrk.out" || true)
echo "failed requests during two upgrades: ${errors:-none}"
kill "$third" 2>/dev/null || true
