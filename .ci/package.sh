#!/usr/bin/env bash
# The Debian package as an operator meets it: build it with `cargo deb`, install it with
# `dpkg -i`, check its files, user and unit (`systemd-analyze verify` when systemd is present),
# start `/usr/bin/weir -p /etc/weir` as the `weir` user, proxy a request through a route, scrape
# the metrics, find the request in /var/log/weir/access.log, stop it, purge. Needs root; uses
# the default ports 9080, 9090 and 9091 of the packaged configuration.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package check failed: $*" >&2; [ -f "${log:-/dev/null}" ] && tail -n 40 "$log" >&2; exit 1; }

command -v cargo-deb >/dev/null 2>&1 || cargo install -q cargo-deb --locked
# PROFILE=dev packages the binary a `cargo test` or `cargo build` already made (target/debug/weir),
# without building again (CI does so); by default the release build is made and packaged.
if [ "${PROFILE:-release}" = release ]; then
  cargo deb -q >/dev/null
else
  bin="${CARGO_TARGET_DIR:-target}/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/weir"
  [ -x "$bin" ] || fail "no $bin to package: build it first (cargo build --profile $PROFILE)"
  cargo deb -q --profile "$PROFILE" --no-build >/dev/null
fi
deb=$(ls -t "${CARGO_TARGET_DIR:-target}"/debian/weir_*_amd64.deb | head -n 1)
echo "built $deb ($(du -h "$deb" | cut -f1))"
grep -q './usr/bin/weir$' <<<"$(dpkg-deb --contents "$deb")" || fail "no /usr/bin/weir in the package"
grep -qx /etc/weir/conf/config.yaml <<<"$(dpkg-deb -I "$deb" conffiles)" || fail "config.yaml is not a conffile"

dpkg -i "$deb" >/dev/null
cleanup() {
  # Never `kill 0`: that would be this whole process group, CI included.
  for pid in "${weir_pid:-}" "${up_pid:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null; done
  dpkg --purge weir >/dev/null 2>&1 || true
}
trap cleanup EXIT
id weir >/dev/null || fail "no weir user"
[ "$(stat -c %U /var/lib/weir)" = weir ] && [ "$(stat -c %U /var/log/weir)" = weir ] || fail "data/log owners"
[ "$(stat -c '%U:%G %a' /etc/weir/conf/config.yaml)" = "root:weir 640" ] || fail "config.yaml must be root:weir 0640"
[ "$(readlink /etc/weir/data)" = /var/lib/weir ] && [ "$(readlink /etc/weir/logs)" = /var/log/weir ] || fail "prefix links"
if command -v systemd-analyze >/dev/null 2>&1; then
  systemd-analyze verify /lib/systemd/system/weir.service || fail "systemd-analyze verify"
  echo "systemd-analyze verify: ok"
else
  echo "systemd-analyze not installed: unit not verified"
fi

# An upstream, and a route to it (editing the conffile, as an operator would).
up_dir=$(mktemp -d)
echo "hello from the upstream" > "$up_dir/hello.txt"
python3 -m http.server 18080 --bind 127.0.0.1 --directory "$up_dir" >/dev/null 2>&1 &
up_pid=$!
sed -i 's/^routes: \[\]$//' /etc/weir/conf/resources.yaml
printf 'routes:\n  - id: pkg\n    uri: /pkg/*\n    plugins:\n      proxy-rewrite: {regex_uri: ["^/pkg/(.*)", "/$1"]}\n    upstream: {nodes: {"127.0.0.1:18080": 1}}\n' >> /etc/weir/conf/resources.yaml

runuser -u weir -- /usr/bin/weir -p /etc/weir -t || fail "weir -t on the packaged configuration"
log=$(mktemp)
chmod 666 "$log"
# setpriv execs weir itself (runuser would stay in between, and answer SIGTERM for it).
setpriv --reuid=weir --regid=weir --init-groups /usr/bin/weir -p /etc/weir >"$log" 2>&1 &
weir_pid=$!
for _ in $(seq 1 100); do
  curl -s -o /dev/null http://127.0.0.1:9090/v1/schema && curl -s -o /dev/null http://127.0.0.1:18080/ && break
  sleep 0.1
done
[ "$(ps -o user= -p "$weir_pid")" = weir ] || fail "not running as weir"
body=$(curl -fsS -H 'User-Agent: package-check' http://127.0.0.1:9080/pkg/hello.txt) || fail "proxying through the packaged gateway"
[ "$body" = "hello from the upstream" ] || fail "unexpected body: $body"
# Into a variable first: `curl | grep -q` fails under pipefail once grep stops reading early.
metrics=$(curl -fsS http://127.0.0.1:9091/weir/prometheus/metrics) || fail "scraping the metrics"
grep -q '^weir_http_status{code="200",route="pkg",matched_uri="/pkg/\*"' <<<"$metrics" \
  || fail "the request is not in the metrics"
for _ in $(seq 1 30); do grep -q '"GET /pkg/hello.txt HTTP/1.1" 200 .*"package-check"' /var/log/weir/access.log 2>/dev/null && break; sleep 0.1; done
grep -q '"GET /pkg/hello.txt HTTP/1.1" 200 .*"package-check"' /var/log/weir/access.log || fail "no access log line"
[ "$(stat -c %U /var/log/weir/access.log)" = weir ] || fail "access.log owner"
ls /var/lib/weir/short-url.db >/dev/null 2>&1 || fail "short-url keeps no data in /var/lib/weir"
kill -TERM "$weir_pid"
wait "$weir_pid" || fail "weir did not stop cleanly on SIGTERM"
weir_pid=
grep -q "stopped" "$log" || fail "no clean stop"
dpkg --purge weir >/dev/null
[ ! -e /var/lib/weir ] && [ ! -e /etc/weir/data ] || fail "purge left data behind"
echo "package: installed, served a proxied request as weir, logged it, exported it, purged"
