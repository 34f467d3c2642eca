#!/usr/bin/env bash
# Latency of requests served while a large table is published: one nginx
# worker enforcing a small table answers a keep-alive client that sends
# requests back to back; 65,536 strategies (N) are published meanwhile. The
# worker builds the new table on a helper thread (core::loader), so no
# request should wait for the build: p50/p99/max of the requests sent from
# the moment the publish completes to 2 s later, and the same for the
# second before the publish, as a baseline on this machine.
#
#   scripts/bench-publish.sh [debian|vendored]     (env: N=65536 SKIP_BUILD=1)
set -euo pipefail
target="${1:-debian}"
n="${N:-65536}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/bench-nginx.sh
. "$root/scripts/lib/bench-nginx.sh"
bench_setup "$target" publish
pid="" cpid=""
cleanup() {
    if [ -n "$cpid" ]; then kill "$cpid" 2>/dev/null || true; fi
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
export RATE_CTL_TOOL_MAX_STRATEGIES=$((n + 1024)) RATE_CTL_TOOL_SEGMENT_MB=32

echo "strategy id=1 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench" >"$dir/small"
# The large table also names /probe (strategy 2): the script knows the
# worker has it when /probe answers with that strategy.
awk -v n="$n" 'BEGIN {
    print "strategy id=1 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench"
    print "strategy id=2 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/probe"
    for (i = 3; i <= n; i++)
        printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when ip=10.%d.%d.%d api=/x%d\n", i, int(i / 65536), int(i / 256) % 256, i % 256, i % 50
}' >"$dir/large"
(umask 0 && "$tool" publish "$dir/shm" "$dir/small" 1 >/dev/null)

port=$((30000 + RANDOM % 20000))
conf_head 1 notice >"$dir/nginx.conf"
cat >>"$dir/nginx.conf" <<CONF
http {
    access_log off;
    rate_ctl_shm $dir/shm;
    server {
        listen 127.0.0.1:$port;
        location /bench { rate_ctl on; empty_gif; }
        location /probe { rate_ctl on; add_header X-Strategy \$rate_ctl_strategy always; empty_gif; }
    }
}
CONF
"$nginx" -p "$dir/" -c "$dir/nginx.conf" &
pid=$!

for _ in $(seq 1 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/bench" && break
    sleep 0.1
done
# The client: back-to-back requests for up to 60 s, each line "start_s latency_ms status".
python3 - "$port" "$dir/lat" <<'PY' &
import http.client, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
with open(out, "w", buffering=1) as f:
    end = time.time() + 60
    while time.time() < end:
        t = time.time()
        c.request("GET", "/bench")
        r = c.getresponse()
        r.read()
        f.write(f"{t:.6f} {(time.time() - t) * 1000:.3f} {r.status}\n")
PY
cpid=$!
sleep 2
before=$(date +%s.%N)
(umask 0 && "$tool" publish "$dir/shm" "$dir/large" 2 >/dev/null)
published=$(date +%s.%N)
# Until the worker decides with the new table, then 1 s more.
probe() { curl -sf -D - -o /dev/null "http://127.0.0.1:$port/probe" | grep -qi '^x-strategy: 2'; }
for _ in $(seq 1 600); do
    probe && break
    sleep 0.05
done
loaded=$(date +%s.%N)
sleep 1
kill "$cpid" 2>/dev/null || true
wait "$cpid" 2>/dev/null || true
cpid=""
probe || { echo "the worker never loaded the table:" >&2; tail -5 "$dir/logs/error.log" >&2; exit 1; }
python3 - "$dir/lat" "$before" "$published" "$loaded" "$n" "$("$nginx" -v 2>&1 | sed 's/.*version: //')" <<'PY'
import sys
path, before, published, loaded, n, version = sys.argv[1], *map(float, sys.argv[2:5]), sys.argv[5], sys.argv[6]
rows = [l.split() for l in open(path)]
rows = [(float(t), float(ms), s) for t, ms, s in rows]
bad = [r for r in rows if r[2] != "200"]
if bad:
    sys.exit(f"{len(bad)} requests did not get 200")
def stats(name, lo, hi):
    v = sorted(ms for t, ms, _ in rows if lo <= t < hi)
    if not v:
        print(f"| {name} | 0 | | | |")
        return
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    print(f"| {name} | {len(v)} | {q(0.5):.2f} | {q(0.99):.2f} | {v[-1]:.2f} |")
print(f"nginx: {version}, one worker; publish of {n} strategies took {published - before:.2f} s (tool), "
      f"the worker decided with the new table {loaded - published:.2f} s after it")
print()
print("| requests sent | n | p50 ms | p99 ms | max ms |")
print("|---|---:|---:|---:|---:|")
stats("1 s before the publish", before - 1, before)
stats("from publish end to the new table + 1 s", published, loaded + 1)
PY
