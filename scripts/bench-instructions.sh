#!/usr/bin/env bash
# Instructions per request (valgrind callgrind: repeatable whatever else the
# machine is doing) for plain empty_gif, limit_req (one zone), rate_ctl with
# 10,000 strategies and a matching strategy that never rejects, and the
# rate_ctl reject path. One nginx worker (master_process off) per case runs
# under callgrind twice, for 500 and 2,500 keep-alive requests; the
# difference / 2,000 is the cost of one request, start-up and table load
# cancelled out.
#
#   scripts/bench-instructions.sh [debian|vendored]
#   env: SKIP_BUILD=1, CASES="plain ratectl", CALLGRIND_ARGS="--dump-instr=yes",
#   KEEP_PROFILES=DIR (keeps the
#   callgrind files for callgrind_annotate)
set -euo pipefail
target="${1:-debian}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/bench-table.sh
. "$root/scripts/lib/bench-table.sh"
# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
command -v valgrind >/dev/null || need_packages bench-instructions valgrind
[ -n "${SKIP_BUILD:-}" ] || scripts/build-module.sh "$target" >&2
cargo build -q --example rate-ctl-test-tool
tool="$root/target/debug/examples/rate-ctl-test-tool"
if [ "$target" = vendored ]; then nginx="$root/target/modules/vendored/nginx"; else nginx=/usr/sbin/nginx; fi
module="$root/target/modules/$target/ngx_http_rate_ctl_module.so"

dir="$(mktemp -d /tmp/rate_ctl_instr_XXXXXX)"
chmod 0755 "$dir"
mkdir -p "$dir/logs"
vpid=""
cleanup() {
    if [ -n "$vpid" ]; then kill "$vpid" 2>/dev/null || true; fi
    if [ -n "${KEEP_PROFILES:-}" ] && mkdir -p "$KEEP_PROFILES"; then
        cp "$dir"/callgrind.* "$KEEP_PROFILES"/ 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
# Two tables of 10,000 strategies that differ in the one matching /bench:
# pass (never rejects) and reject (rejects all but the first request).
for kind in pass reject; do
    {
        background_strategies
        if [ $kind = pass ]; then
            echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench"
        else
            echo "strategy id=20002 algorithm=fixed_window rate=1 per=day when api=/bench"
        fi
    } >"$dir/table.$kind"
    (umask 0 && "$tool" publish "$dir/shm.$kind" "$dir/table.$kind" 1 >/dev/null)
done
port=$((30000 + RANDOM % 10000))

# Every case runs the same server: the same two locations, the table
# loaded; only what /bench does differs (so location lookup, URI parsing
# and the worker's heap are alike and the difference is the limiter).
config() {
    local shm=pass directive=""
    case $1 in
    plain) ;;
    limitreq) directive="limit_req zone=one burst=1000000 nodelay;" ;;
    ratectl) directive="rate_ctl on;" ;;
    reject) directive="rate_ctl on;" shm=reject ;;
    *) echo "unknown case $1" >&2 && exit 2 ;;
    esac
    cat >"$dir/nginx.conf" <<CONF
load_module $module;
master_process off;
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    rate_ctl_shm $dir/shm.$shm;
    rate_ctl_log_level info;
    limit_req_zone \$binary_remote_addr zone=one:1m rate=1000000r/s;
    server {
        listen 127.0.0.1:$port;
        location /bench { $directive empty_gif; }
        location /other { rate_ctl on; empty_gif; }
    }
}
CONF
}

# run CASE N -> total instructions of a worker that served N requests
run() {
    local case=$1 n=$2
    local out="$dir/callgrind.$case.$n"
    local cg_args=()
    read -ra cg_args <<<"${CALLGRIND_ARGS:-}"
    valgrind --tool=callgrind "${cg_args[@]}" --callgrind-out-file="$out" "$nginx" -p "$dir/" -c "$dir/nginx.conf" \
        >/dev/null 2>&1 &
    vpid=$!
    python3 - "$port" "$n" <<'PY'
import http.client, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        break
    except OSError:
        time.sleep(0.1)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for _ in range(n):
    c.request("GET", "/bench")
    c.getresponse().read()
PY
    kill -TERM "$vpid"
    wait "$vpid" || true
    vpid=""
    awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

declare -A per
read -ra cases <<<"${CASES:-plain limitreq ratectl reject}"
for c in "${cases[@]}"; do
    config "$c"
    a=$(run "$c" 500)
    b=$(run "$c" 2500)
    per[$c]=$(((b - a) / 2000))
done
echo "nginx: $("$nginx" -v 2>&1 | sed 's/.*version: //'), one worker under callgrind, instructions per request"
echo
echo "| case | instructions/request | vs plain |"
echo "|---|---:|---:|"
for c in "${cases[@]}"; do
    base=${per[plain]:-${per[$c]}}
    echo "| $c | ${per[$c]} | $(awk -v a="${per[$c]}" -v b="$base" 'BEGIN { printf "%+d (%+.1f %%)", a - b, 100 * (a - b) / b }') |"
done
if grep -E '\[(alert|crit|emerg)\]' "$dir/logs/error.log"; then
    echo "error.log has alerts" >&2
    exit 1
fi
