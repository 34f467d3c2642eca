#!/usr/bin/env bash
# rate_ctl benchmark: worker CPU time per request (from /proc/<pid>/schedstat)
# and requests/s for plain empty_gif, limit_req (one zone) and rate_ctl with
# 10,000 strategies loaded, alternating in one run (ROUNDS rounds, each case
# once per round; medians reported, and the median of the per-round ratios
# rate_ctl / limit_req, which cancels the drift of a noisy machine); then
# accuracy at 1000 r/s under overload for rate_ctl and limit_req.
#
#   scripts/bench.sh [debian|vendored]      (env: DURATION=6 ACC_DURATION=10 ROUNDS=5 CONNS=32 SKIP_BUILD=1
#                                             WORKERS=2 ACCURACY=1)
#
# WORKERS=1: one worker pinned to CPU 0 and wrk pinned to CPU 1 (issue
# 29's CPU bar: "one pinned worker, best of 5 alternating runs"); the
# report then also gives each case's best (lowest) CPU per request over
# the rounds. ACCURACY=0 skips the accuracy runs.
#
# Locations answer from a content handler (empty_gif): `return` runs in the
# REWRITE phase, before PREACCESS, and would measure nothing.
set -euo pipefail
target="${1:-debian}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/bench-table.sh
. "$root/scripts/lib/bench-table.sh"
DURATION="${DURATION:-6}"
# Each accuracy run overloads the limiter for this long (10 s).
ACC_DURATION="${ACC_DURATION:-10}"
ROUNDS="${ROUNDS:-5}"
CONNS="${CONNS:-32}"
WORKERS="${WORKERS:-2}"
case $WORKERS in
1) affinity="01" wrk_pin=(taskset -c 1) ;;
2) affinity="01 10" wrk_pin=() ;;
*) echo "WORKERS: 1 or 2" >&2 && exit 2 ;;
esac

# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
command -v wrk >/dev/null || need_packages bench wrk
# SKIP_BUILD=1 uses the modules already in target/modules/.
[ -n "${SKIP_BUILD:-}" ] || scripts/build-module.sh "$target" >&2
tool="${RATE_CTL_TEST_TOOL:-$root/target/debug/examples/rate-ctl-test-tool}"
[ -n "${RATE_CTL_TEST_TOOL:-}" ] || cargo build -q --example rate-ctl-test-tool
if [ "$target" = vendored ]; then nginx="$root/target/modules/vendored/nginx"; else nginx=/usr/sbin/nginx; fi
module="$root/target/modules/$target/ngx_http_rate_ctl_module.so"

dir="$(mktemp -d /tmp/rate_ctl_bench_XXXXXX)"
chmod 0755 "$dir"
mkdir -p "$dir/logs"
port=$((20000 + RANDOM % 20000))
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT

# 10,000 strategies on other clients, plus the ones the benchmark hits.
{
    background_strategies
    echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/ratectl"
    echo "strategy id=20002 algorithm=fixed_window rate=1 per=day when api=/reject"
    echo "strategy id=20003 algorithm=token_bucket rate=1000 per=second burst=1 when api=/acc"
    echo "strategy id=20004 algorithm=token_bucket rate=1000 per=second burst=10 when api=/acc10"
} >"$dir/table"
(umask 0 && "$tool" publish "$dir/shm" "$dir/table" 1 >/dev/null)

cat >"$dir/nginx.conf" <<CONF
load_module $module;
worker_processes $WORKERS;
worker_cpu_affinity $affinity;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    rate_ctl_shm $dir/shm;
    rate_ctl_log_level info;
    limit_req_zone \$binary_remote_addr zone=one:1m rate=1000000r/s;
    limit_req_zone \$binary_remote_addr zone=acc:1m rate=1000r/s;
    limit_req_zone \$binary_remote_addr zone=acc10:1m rate=1000r/s;
    limit_req_log_level info;
    error_log $dir/logs/error.log warn;
    server {
        listen 127.0.0.1:$port;
        location /plain    { empty_gif; }
        location /limitreq { limit_req zone=one burst=1000000 nodelay; empty_gif; }
        location /ratectl  { rate_ctl on; empty_gif; }
        location /reject   { rate_ctl on; empty_gif; }
        location /lracc    { limit_req zone=acc; limit_req_status 503; empty_gif; }
        location /acc      { rate_ctl on; empty_gif; }
        location /lracc10  { limit_req zone=acc10 burst=10 nodelay; limit_req_status 503; empty_gif; }
        location /acc10    { rate_ctl on; empty_gif; }
    }
}
CONF
"$nginx" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/logs/error.log"
sleep 0.5
pid="$(cat "$dir/nginx.pid")"
workers="$(ps -o pid= --ppid "$pid" | tr '\n' ' ')"

cpu_ns() { local s=0 w; for w in $workers; do s=$((s + $(cut -d' ' -f1 "/proc/$w/schedstat"))); done; echo "$s"; }

# run PATH [SECONDS] -> "requests non2xx seconds cpu_ns"
run() {
    local path=$1 duration=${2:-$DURATION} before after out
    before=$(cpu_ns)
    out=$("${wrk_pin[@]}" wrk -t1 -c"$CONNS" -d"${duration}s" --latency "http://127.0.0.1:$port$path" 2>&1)
    after=$(cpu_ns)
    local reqs non2xx secs
    reqs=$(awk '/requests in/ {print $1}' <<<"$out")
    secs=$(awk '/requests in/ {gsub(/s,/, "", $4); print $4}' <<<"$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
    echo "$reqs ${non2xx:-0} $secs $((after - before))"
}

declare -A cpus rpss
cases=(plain limitreq ratectl reject)
ratios=""
for round in $(seq 1 "$ROUNDS"); do
    declare -A this=()
    for c in "${cases[@]}"; do
        read -r reqs non2xx secs cpu < <(run "/$c")
        per=$(awk -v c="$cpu" -v r="$reqs" 'BEGIN { printf "%.3f", c / r / 1000 }')
        rps=$(awk -v r="$reqs" -v s="$secs" 'BEGIN { printf "%.0f", r / s }')
        echo "round $round $c: $rps req/s, $per us CPU/request, non-2xx $non2xx" >&2
        cpus[$c]+="$per "
        rpss[$c]+="$rps "
        this[$c]=$per
    done
    ratios+="$(awk -v a="${this[ratectl]}" -v b="${this[limitreq]}" 'BEGIN { printf "%.4f", a / b }') "
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

echo
echo "nginx: $("$nginx" -v 2>&1 | sed 's/.*version: //'), $WORKERS worker(s), wrk -t1 -c$CONNS -d${DURATION}s, median of $ROUNDS alternating rounds"
echo
echo "| case | req/s | worker CPU µs/request | vs plain (CPU) | best CPU µs/request | best vs plain |"
echo "|---|---:|---:|---:|---:|---:|"
declare -A med best
for c in "${cases[@]}"; do
    med[$c]=$(median <<<"${cpus[$c]}")
    best[$c]=$(tr ' ' '\n' <<<"${cpus[$c]}" | grep -v '^$' | sort -g | head -n1)
done
for c in "${cases[@]}"; do
    ratio=$(awk -v a="${med[$c]}" -v b="${med[plain]}" 'BEGIN { printf "%.1f %%", 100 * a / b }')
    bratio=$(awk -v a="${best[$c]}" -v b="${best[plain]}" 'BEGIN { printf "%.1f %%", 100 * a / b }')
    echo "| $c | $(median <<<"${rpss[$c]}") | ${med[$c]} | $ratio | ${best[$c]} | $bratio |"
done
echo
echo "rate_ctl / limit_req worker CPU per request, per round: $ratios(median $(median <<<"$ratios"))"
echo "best of $ROUNDS: rate_ctl / limit_req $(awk -v a="${best[ratectl]}" -v b="${best[limitreq]}" 'BEGIN { printf "%.3f", a / b }'), rate_ctl / plain $(awk -v a="${best[ratectl]}" -v b="${best[plain]}" 'BEGIN { printf "%.3f", a / b }')"
[ "${ACCURACY:-1}" != 0 ] || exit 0

echo
echo "Accuracy: 1000 r/s under overload for ${ACC_DURATION}s, 2 workers."
echo "Allowance = burst + 1000 × seconds. Both limiters read nginx's cached millisecond"
echo "clock; with burst 1 a worker that misses a millisecond (descheduled) loses that token."
echo "| limiter | burst | admitted | allowance | error |"
echo "|---|---:|---:|---:|---:|"
for c in acc:1:rate_ctl lracc:1:limit_req acc10:10:rate_ctl lracc10:10:limit_req; do
    IFS=: read -r path burst name <<<"$c"
    read -r reqs non2xx secs cpu < <(run "/$path" "$ACC_DURATION")
    admitted=$((reqs - non2xx))
    expected=$(awk -v s="$secs" -v b="$burst" 'BEGIN { printf "%.0f", b + 1000 * s }')
    err=$(awk -v a="$admitted" -v e="$expected" 'BEGIN { printf "%+.2f %%", 100 * (a - e) / e }')
    echo "| $name | $burst | $admitted | $expected | $err |"
done
if grep -E '\[(alert|crit|emerg)\]' "$dir/logs/error.log"; then
    echo "error.log has alerts" >&2
    exit 1
fi
