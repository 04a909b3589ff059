# Helpers shared by the benchmark scripts and .ci/schemathesis.sh (source it; it defines
# functions only). Each takes its scratch directory explicitly.

# nginx_upstream DIR PORT [CPU] [LOCATION]: an nginx on 127.0.0.1:PORT, pid in DIR/nginx.pid,
# pinned to CPU when given. Without LOCATION it serves DIR/1k (1 KiB) for every path.
nginx_upstream() {
  local dir=$1 port=$2 cpu=${3:-} location=${4:-}
  mkdir -p "$dir"
  if [ -z "$location" ]; then
    head -c 1024 /dev/zero | tr '\0' 'x' > "$dir/1k"
    location="root $dir; try_files /1k =404;"
  fi
  cat > "$dir/nginx.conf" <<CONF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$port; location / { $location } }
}
CONF
  if [ -n "$cpu" ]; then taskset -c "$cpu" nginx -c "$dir/nginx.conf" -p "$dir"; else nginx -c "$dir/nginx.conf" -p "$dir"; fi
}

# etcd_single DIR NAME CLIENT_PORT PEER_PORT: a one-member etcd in the background (its pid in
# $ETCD_PID), waited for until it answers /health.
etcd_single() {
  local dir=$1 name=$2 client=$3 peer=$4
  etcd --name "$name" --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$name=http://127.0.0.1:$peer" > "$dir/etcd.log" 2>&1 &
  ETCD_PID=$!
  for _ in $(seq 1 100); do [[ "$(curl -s "127.0.0.1:$client/health")" == *true* ]] && return 0; sleep 0.1; done
  echo "etcd did not start: $(tail -n 5 "$dir/etcd.log")" >&2
  return 1
}

# wrk_rps URL: req/s of one wrk run (LOAD_CPU, CONNS, DURATION from the caller); errors and
# non-2xx answers are shown on stderr.
wrk_rps() {
  local out; out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" "$1")
  if echo "$out" | grep -qE 'Non-2xx|Socket errors'; then echo "$out" >&2; fi
  echo "$out" | awk '/Requests\/sec/ {print $2}'
}

# median VALUES...: the middle value (the upper one of an even count).
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# bench_cleanup: the EXIT trap of scripts that keep their background pids in PIDS and their
# nginx upstream in $WORK/up: stops them all and removes $WORK.
bench_cleanup() {
  [ -f "$WORK/up/nginx.pid" ] && kill "$(cat "$WORK/up/nginx.pid")" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

# cpu_ticks PID...: CPU time (user + system, in clock ticks) the processes and their threads
# have used so far. On a shared machine a proxy's CPU time per request repeats far better than
# its req/s, and it is not capped by the load generator's core.
cpu_ticks() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}

# core_ticks CPU: "busy total" clock ticks of one CPU so far (from /proc/stat; busy is all but
# idle and iowait). Two readings give how busy that core was in between: a load core near 100 %
# caps req/s whatever the proxy on the other core does.
core_ticks() { awk -v c="cpu$1" '$1 == c {b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6}' /proc/stat; }
# busy_pct "BUSY TOTAL" "BUSY TOTAL": the core's busy share between two core_ticks readings.
busy_pct() { awk -v a="$1" -v b="$2" 'BEGIN {split(a, x, " "); split(b, y, " "); t = y[2] - x[2]; printf "%.0f", t ? 100 * (y[1] - x[1]) / t : 0}'; }

# us_per TICKS N: microseconds of CPU per unit, for TICKS clock ticks spent on N units.
us_per() { awk -v t="$1" -v n="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", n ? t * 1e6 / hz / n : 0}'; }
