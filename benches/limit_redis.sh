#!/usr/bin/env bash
# Shared rate limits: proxy req/s through limit-count with policy redis vs policy local, both
# with every request asking Redis (exact) and with `sync_interval` (batched increments; issue 25's
# target: >= 0.9x local). Weir on one core (worker_processes 1); wrk, the nginx upstream (1 KiB)
# and redis-server on the other. The limit is never reached: this measures the cost of counting.
# Runs alternate (local, redis, redis with sync_interval, local, ...) so that drift affects all alike.
#
#   benches/limit_redis.sh        # needs: wrk, nginx, redis-server (apt-get install wrk nginx-light redis-server)
#   DURATION=10 ROUNDS=3 CONNS=16 benches/limit_redis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-limit-redis.XXXXXX)
chmod 755 "$WORK"
SYNC=${SYNC:-0.1}  # sync_interval of the third route, seconds
UP_PORT=18280; REDIS_PORT=18281; WEIR_PORT=18282; CTL_PORT=18283
[ -x "$BIN" ] || cargo build --release
for tool in wrk nginx redis-server redis-cli; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
. benches/lib.sh
trap bench_cleanup EXIT

mkdir -p "$WORK/weir/conf"
nginx_upstream "$WORK/up" "$UP_PORT" "$LOAD_CPU"
taskset -c "$LOAD_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" > "$WORK/redis.log" 2>&1 &
PIDS+=($!)

cat > "$WORK/weir/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $WEIR_PORT}]
  ssl: {enable: false}
  worker_processes: 1
  control: {port: $CTL_PORT}
CONF
limit='count: 1000000000, time_window: 3600, show_limit_quota_header: true'
cat > "$WORK/weir/conf/resources.yaml" <<RES
routes:
  - {id: local, uri: /local, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}, plugins: {limit-count: {$limit}}}
  - {id: redis, uri: /redis, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}, plugins: {limit-count: {$limit, policy: redis, redis_host: 127.0.0.1, redis_port: $REDIS_PORT}}}
  - {id: redis-sync, uri: /redis-sync, upstream: {nodes: {"127.0.0.1:$UP_PORT": 1}}, plugins: {limit-count: {$limit, policy: redis, redis_host: 127.0.0.1, redis_port: $REDIS_PORT, sync_interval: $SYNC}}}
RES
taskset -c "$PROXY_CPU" "$BIN" -p "$WORK/weir" > "$WORK/weir.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$WEIR_PORT/redis")" = 200 ] && break
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$WEIR_PORT/redis")" = 200 ] || { tail "$WORK/weir.log"; exit 1; }

run() { wrk_rps "http://127.0.0.1:$WEIR_PORT/$1"; }
declare -a L R S
for i in $(seq 1 "$ROUNDS"); do
  L+=("$(run local)"); R+=("$(run redis)"); S+=("$(run redis-sync)")
  echo "round $i: local ${L[-1]} req/s, redis ${R[-1]} req/s, redis with sync_interval $SYNC ${S[-1]} req/s"
done
ml=$(median "${L[@]}"); mr=$(median "${R[@]}"); ms=$(median "${S[@]}")
keys=$(redis-cli -p "$REDIS_PORT" --scan --pattern 'weir:limit-count:*' | wc -l)
echo "limit-count policy redis vs local: ${mr} vs ${ml} req/s = $(awk -v a="$mr" -v b="$ml" 'BEGIN {printf "%.2f", a/b}')x (every request asks Redis; exact); counters in Redis: $keys"
echo "limit-count policy redis, sync_interval $SYNC, vs local: ${ms} vs ${ml} req/s = $(awk -v a="$ms" -v b="$ml" 'BEGIN {printf "%.2f", a/b}')x (target >= 0.9x; how exact: docs/plugins/limit-count.md)"
