#!/usr/bin/env bash
# Instructions per proxied request of the auth plugins, side by side: key-auth alone and
# basic-auth alone, on the same consumer (it carries both credentials) and the same request
# (it sends both), with ../shared/tools/instr_per_request.sh (callgrind; needs valgrind, nginx
# and a release build). Usage: benches/auth_instr.sh
set -eu
cd "$(dirname "$0")/.."
tool=${INSTR_TOOL:-../shared/tools/instr_per_request.sh}
[ -r "$tool" ] || { echo "no $tool"; exit 1; }
variant=$(mktemp /tmp/auth_instr.XXXX.sh)
trap 'rm -f "$variant"' EXIT
# basic jack:bench-password
sed -e 's/{\\"key-auth\\": {\\"key\\": \\"bench-key\\"}}/{\\"key-auth\\": {\\"key\\": \\"bench-key\\"}, \\"basic-auth\\": {\\"username\\": \\"jack\\", \\"password\\": \\"bench-password\\"}}/' \
    -e 's/headers={"apikey": "bench-key"}/headers={"apikey": "bench-key", "authorization": "Basic amFjazpiZW5jaC1wYXNzd29yZA=="}/' \
    "$tool" > "$variant"
grep -q basic-auth "$variant" && grep -q amFjazpi "$variant" || { echo "the measuring script changed shape"; exit 1; }
for plugins in '{"key-auth": {}}' '{"basic-auth": {}}'; do
  printf '%-22s ' "$plugins"
  bash "$variant" "$plugins" | tail -1
done
