#!/usr/bin/env bash
# One command on a fresh Debian 12 machine (as root): installs what it
# needs, builds the module (vendored nginx 1.28) and the rate-ctl binary,
# starts `rate-ctl serve` (REST API + admin page, SQLite store) on
# 127.0.0.1:9090, the agent (long-polling the service) and nginx with the
# module on 127.0.0.1:8080, seeds one strategy and shows it enforced.
# Ctrl-C stops everything it started.
#
#   scripts/demo.sh              # runs until Ctrl-C
#   DEMO_SECONDS=10 scripts/demo.sh   # stops by itself (used by the tests)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

scripts/deps.sh
scripts/build-module.sh vendored
cargo build --release --bin rate-ctl
bin="$root/target/release/rate-ctl"
nginx="$root/target/modules/vendored/nginx"
module="$root/target/modules/vendored/ngx_http_rate_ctl_module.so"

dir="${DEMO_DIR:-/tmp/rate-ctl-demo}"
shm="${DEMO_SHM:-/dev/shm/rate_ctl_demo}"
store="sqlite:$dir/rate-ctl.db"
mkdir -p "$dir/logs" "$dir/tmp"
chmod 0755 "$dir" "$dir/tmp"
sed -e "s#@MODULE@#$module#g" -e "s#@PREFIX@#$dir#g" -e "s#@SHM@#$shm#g" \
    nginx-conf/demo.conf >"$dir/nginx.conf"
# The agent's files are 0640 (configuration) and 0660 (state) for its own
# user and group: as root, nginx's workers run as nobody:nogroup, so the
# files go to that group (never world-accessible: --mode refuses it).
access=(--mode 0660)
if [ "$(id -u)" = 0 ]; then
    access+=(--group nogroup)
    sed -i '1i user nobody nogroup;' "$dir/nginx.conf"
else
    # The workers trust a file owned by root or its directory's owner
    # (root's /dev/shm here): name this user, the agent's, as the owner.
    sed -i "s#^\( *\)rate_ctl_shm .*#&\n\1rate_ctl_shm_owner $(id -un);#" "$dir/nginx.conf"
fi

pids=()
stop() {
    trap - INT TERM EXIT
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    echo "demo: stopped nginx, the agent and the service"
}
trap stop INT TERM EXIT

token_file="$dir/admin.token"
"$bin" --store "$store" serve --listen 127.0.0.1:9090 --admin-token-file "$token_file" \
    >"$dir/logs/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    curl -s -o /dev/null http://127.0.0.1:9090/api/v1/health && break
    sleep 0.1
done
token="$(cat "$token_file")"
RATE_CTL_TOKEN="$token" "$bin" agent --store http://127.0.0.1:9090 --shm "$shm" \
    --host-id demo --weight 1 "${access[@]}" >"$dir/logs/agent.log" 2>&1 &
pids+=($!)
"$nginx" -p "$dir" -c "$dir/nginx.conf" &
pids+=($!)

# Seed one strategy (once): 2 requests a second for /pay, burst 2.
id="$("$bin" --store "$store" strategy list | awk '/demo-pay/ {print $1; exit}')"
if [[ -z "$id" ]]; then
    id="$("$bin" --store "$store" strategy add --name demo-pay --match api=/pay \
        --algorithm token_bucket --rate 2 --per second --burst 2 --scope host)"
fi
for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:8080/" && break
    sleep 0.1
done
sleep 1

cat <<TXT

rate_ctl demo is running.
  admin page:                      http://127.0.0.1:9090/
  admin token:                     $token   (also in $token_file)
  nginx (vendored 1.28 + module):  http://127.0.0.1:8080/   (logs: $dir/logs)
  agent:                           long-polls http://127.0.0.1:9090 -> $shm
  store:                           SQLite $dir/rate-ctl.db
  stats:                           curl -s http://127.0.0.1:8080/rate_ctl/stats
  strategies:                      $bin --store $store strategy list

Five requests to /pay at once (strategy $id "demo-pay": 2/s, burst 2):
TXT
for _ in 1 2 3 4 5; do
    curl -s -o /dev/null -w '  curl http://127.0.0.1:8080/pay -> %{http_code}\n' http://127.0.0.1:8080/pay
done
cat <<TXT

Try:  for i in 1 2 3 4 5; do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:8080/pay; done
Change the limit (applies within a second, no reload):
      $bin --store $store strategy update $id --rate 100
      (or in the admin page: edit demo-pay)
Press Ctrl-C to stop.
TXT
if [[ -n "${DEMO_SECONDS:-}" ]]; then
    sleep "$DEMO_SECONDS"
else
    wait
fi
