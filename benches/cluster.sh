#!/usr/bin/env bash
# Cluster benchmark: three Weir instances on one etcd. Measures
#   - propagation: a route PUT through instance A's Admin API, until instances B and C serve it
#     (p50 / p99 over CHANGES changes; target p99 <= 100 ms on loopback);
#   - cold start with ROUTES routes in etcd: process start to the last route served (target
#     <= 2 s for 10,000);
#   - route changes under proxy load with ROUTES routes: wrk on instance A while LOAD_CHANGES
#     routes are written to etcd; each change's apply time (A's "applied in" log line) and its
#     write-to-served latency (target <= 20 ms), and wrk's errors and non-2xx (target 0).
#
#   benches/cluster.sh          # needs: etcd, etcdctl (apt-get install etcd-server etcd-client)
#   CHANGES=1000 ROUTES=10000 benches/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CHANGES=${CHANGES:-1000}
ROUTES=${ROUTES:-10000}
LOAD_CHANGES=${LOAD_CHANGES:-100}
BIN=${BIN:-target/release/weir}
WORK=$(mktemp -d /tmp/weir-cluster-bench.XXXXXX)
ETCD_PORT=18479; ETCD_PEER=18480; UP_PORT=18481
[ -x "$BIN" ] || cargo build --release
for tool in etcd etcdctl python3 wrk nginx; do command -v "$tool" >/dev/null || { echo "$tool is required"; exit 1; }; done

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

. benches/lib.sh
etcd_single "$WORK" bench "$ETCD_PORT" "$ETCD_PEER"
PIDS+=("$ETCD_PID")
export ETCDCTL_API=3

# The upstream: nginx answering 200 "ok" to everything (it keeps up with wrk).
nginx_upstream "$WORK/up" "$UP_PORT" "" 'return 200 "ok";'
trap 'kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true; cleanup' EXIT

instance() { # NAME HTTP CONTROL ADMIN
  mkdir -p "$WORK/$1/conf"
  cat > "$WORK/$1/conf/config.yaml" <<CONF
gateway:
  node_listen: [{ip: 127.0.0.1, port: $2}]
  ssl: {enable: false}
  worker_processes: 1
  control: {port: $3}
deployment:
  config_provider: etcd
  etcd: {host: ["http://127.0.0.1:$ETCD_PORT"]}
  admin:
    admin_listen: {ip: 127.0.0.1, port: $4}
    admin_key: [{name: bench, key: bench-admin-key, role: admin}]
plugin_attr:
  prometheus:
    export_addr: {ip: 127.0.0.1, port: $(($2 + 4))}
CONF
  "$BIN" -p "$WORK/$1" > "$WORK/$1.log" 2>&1 &
  PIDS+=($!)
}

# Cold start: ROUTES routes written first, then an instance started and timed until the last
# route answers.
python3 - "$ETCD_PORT" "$ROUTES" "$UP_PORT" <<'PY'
import base64, http.client, json, sys
port, n, up = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
b64 = lambda s: base64.b64encode(s.encode()).decode()
for i in range(n):  # etcd's JSON gateway: one keep-alive connection, no process per key
    v = json.dumps({"uri": f"/cold/{i}", "upstream": {"nodes": {f"127.0.0.1:{up}": 1}}})
    c.request("POST", "/v3/kv/put", json.dumps({"key": b64(f"/weir/routes/cold{i}"), "value": b64(v)}))
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
start=$(date +%s.%N)
instance a 18491 18492 18493
last=$((ROUTES - 1))
for _ in $(seq 1 2000); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:18491/cold/$last")" = 200 ] && break
  sleep 0.005
done
cold=$(python3 -c "import time; print(f'{time.time() - $start:.3f}')")
echo "cold start with $ROUTES routes in etcd: ${cold} s to the last route served (target <= 2 s)"

# Changes under load: wrk on A (16 connections, one route of the 10,000) while routes are written
# to etcd one by one, each waited for on A before the next.
wrk_out="$WORK/wrk.txt"
wrk -t1 -c16 -d600s "http://127.0.0.1:18491/cold/1" > "$wrk_out" 2>&1 &
WRK=$!
sleep 1
python3 - "$ETCD_PORT" "$LOAD_CHANGES" "$UP_PORT" <<'PY'
import base64, http.client, json, statistics, sys, time
port, n, up = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
etcd = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
gw = http.client.HTTPConnection("127.0.0.1", 18491, timeout=10)
b64 = lambda s: base64.b64encode(s.encode()).decode()
lat = []
for i in range(n):
    v = json.dumps({"uri": f"/load/{i}", "upstream": {"nodes": {f"127.0.0.1:{up}": 1}}})
    t0 = time.perf_counter()
    etcd.request("POST", "/v3/kv/put", json.dumps({"key": b64(f"/weir/routes/load{i}"), "value": b64(v)}))
    r = etcd.getresponse(); r.read()
    while True:
        gw.request("GET", f"/load/{i}"); r = gw.getresponse(); r.read()
        if r.status == 200:
            break
    lat.append((time.perf_counter() - t0) * 1000)
lat.sort()
print(f"route change under load ({n} changes, {len(lat)} served): write-to-served p50 {lat[len(lat)//2]:.1f} ms, p99 {lat[max(0, int(len(lat)*0.99)-1)]:.1f} ms")
PY
kill -INT "$WRK"; wait "$WRK" 2>/dev/null || true
grep -o 'applied in [0-9.]* ms' "$WORK/a.log" | tail -n "$LOAD_CHANGES" | awk '{print $3}' | sort -n \
  | awk '{a[NR]=$1} END {i=int(NR*0.99); if (i < 1) i=1; printf "route change under load: apply p50 %.1f ms, p99 %.1f ms (A log; target p99 <= 5 ms)\n", a[int(NR/2)+1], a[i]}'
reqs=$(grep -Eo '[0-9]+ requests in' "$wrk_out" | awk '{print $1}')
bad=$(grep -E 'Non-2xx|Socket errors' "$wrk_out" || true)
echo "proxy load meanwhile: ${reqs:-?} requests, errors/non-2xx: ${bad:-none} (target none)"

instance b 18501 18502 18503
instance c 18511 18512 18513
for port in 18501 18511 18493; do
  for _ in $(seq 1 200); do curl -s -o /dev/null "127.0.0.1:$port/" && break; sleep 0.05; done
  curl -s -o /dev/null "127.0.0.1:$port/" || { echo "port $port does not answer:"; tail -n 3 "$WORK"/[abc].log; exit 1; }
done

python3 - "$CHANGES" "$UP_PORT" <<'PY'
import http.client, json, statistics, sys, time
n, up = int(sys.argv[1]), sys.argv[2]
admin = http.client.HTTPConnection("127.0.0.1", 18493, timeout=10)
peers = [http.client.HTTPConnection("127.0.0.1", p, timeout=10) for p in (18501, 18511)]
def served(c, path):
    c.request("GET", path); r = c.getresponse(); r.read(); return r.status == 200
lat, writes = [], []
for i in range(n):
    body = json.dumps({"uri": f"/p/{i}", "upstream": {"nodes": {f"127.0.0.1:{up}": 1}}})
    t0 = time.perf_counter()
    admin.request("PUT", f"/apisix/admin/routes/p{i}", body, {"X-API-KEY": "bench-admin-key"})
    r = admin.getresponse(); r.read()
    assert r.status in (200, 201), r.status
    writes.append((time.perf_counter() - t0) * 1000)
    pending = list(peers)
    while pending:
        pending = [c for c in pending if not served(c, f"/p/{i}")]
    lat.append((time.perf_counter() - t0) * 1000)
lat.sort()
p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
print(f"propagation over {n} changes (Admin API PUT on A until B and C serve it): p50 {p50:.1f} ms, p99 {p99:.1f} ms (target p99 <= 100 ms)")
writes.sort()
print(f"Admin API write (PUT of a route, the answer) with the routes above: p50 {writes[len(writes) // 2]:.1f} ms, p99 {writes[int(len(writes) * 0.99) - 1]:.1f} ms (target <= 10 ms)")
PY
