#!/usr/bin/env bash
# Instructions per request (valgrind callgrind: repeatable whatever else the
# machine is doing). Every case serves GET /bench?a=a5&b=b5 on the same
# server; only what /bench does and the table differ:
#
#   plain       empty_gif
#   limitreq    limit_req, key $binary_remote_addr
#   limitreq2   limit_req, key $arg_a$arg_b
#   ratectl     rate_ctl, "friendly": 10,000 strategies on ip+api, the
#               request matches `api=/bench` (never rejects)
#   reject      the same, the matching strategy rejects (503 path)
#   ratectl_only
#               the friendly case's `api=/bench` strategy alone (no other
#               strategy: one dimension looked up, the matcher's least)
#   args        rate_ctl, dimensions a=$arg_a b=$arg_b, the 10,000 and one
#               strategy `a=a5 b=b5` that matches
#   grid10 grid100 grid250
#               the 10,000 and every `a=ai b=bj` (i, j < N), one matches
#   ranges      rate_ctl, 10,000 strategies `ip=<network> api=/x..` on
#               DISJOINT IPv4 networks of 24 prefix lengths (/8 … /31; few
#               short ones, ~1,000 of each length from /23), the request's
#               127.0.0.1 inside exactly one (127.0.0.0/24), instead of the
#               10,000 exact ones, and `api=/bench`: one match, as in
#               ratectl (compare with ratectl: the bar is ratectl + 100)
#   ratectl_in  ratectl plus `ip=127.0.0.1 api=/x1`: the client's exact
#               address found with a strategy whose api fails (the exact
#               counterpart of ranges, which finds the client's network)
#   ranges_out  the same table without 127.0.0.0/24 (127.0.0.0/8 left
#               empty): the client in no network
#   ranges_nested
#               the same table with 127.0.0.0/24 replaced by three NESTED
#               networks 127.0.0.0/8, /16, /24: 127.0.0.1 inside all three,
#               each found and its api condition checked (three probes and
#               three checks: not the bar's comparison)
#   perkey      rate_ctl, the 10,000 and one per-address strategy (`each
#               ip`, the key table's 1,048,576 entries empty but the
#               client's): the counterpart of limitreq
#   perkey_only the per-address strategy alone (no other strategy in
#               the table): the same configuration as limitreq's single
#               zone
#   perkey_all  a per-address strategy with no condition (`each ip`
#               alone: every request of the location, as limit_req's
#               zone): limit_req's configuration exactly
#   perkey90    the same with the key table about 90 % occupied (943,718
#               other addresses charged before the run by a per-address
#               strategy whose keys stay limited all day)
#   count_if    rate_ctl, the 10,000 and `api=/bench` as a fixed window
#               (never full) with count_if=5xx: every request is checked
#               at PREACCESS and not counted in the LOG phase (issue 31)
#   cost_after  the same with cost_after=st, `rate_ctl_dimension st
#               $status;` (this case only): every request charged 1 up
#               front and 199 more in the LOG phase
#   prefix      the friendly table plus 10,000 prefix strategies
#               `api^=/p<i>/` + 0 to 3 `x` (8 lengths, 4 … 11 bytes), and
#               `api^=/ben` that matches (condition operators, issue 30:
#               the bar is ratectl + 150)
#   template    the friendly table plus 1,000 templates of three shapes
#               (`api~=/t<i>/*/x`, `/t<i>/*`, `/t<i>/*/**`) and
#               `api~=/bench/**` that matches
#   negation    the friendly table plus 1,000 `api=/y<i> a!=a<i>` and
#               `api=/bench a!=a1` that matches (the request's a=a5
#               differs: checked after the lookup)
#   negation_ref
#               negation's exact counterpart: the friendly table plus
#               1,000 `api=/y<i> a=a<i>` and `api=/bench a=a5` that
#               matches (the same two values read, a compared instead of
#               negated: what reading the negated dimension itself costs)
#   *_bg        (ratectl_bg args_bg grid10_bg grid100_bg grid250_bg) the
#               same table plus 100,000 strategies of other shapes
#               ({a, api}, {b, c}, {userid}, {a, b, c}), many sharing the
#               request's a and b values, none matching
#   limitreq_bg limitreq2_bg
#               limitreq and limitreq2 plus what limit_req needs to enforce
#               the same 100,000 background strategies: per shape a map of
#               its 25,000 value combinations (the key of a strategy, or
#               empty: not limited) and a zone, four more limit_req
#               directives (the counterparts of ratectl_bg and args_bg)
#
# One nginx worker (master_process off) per case runs under callgrind
# and serves, in order: /other (rate_ctl on) until the table is enforced
# (every case loads the same table, on the module's helper thread, before
# anything is measured), $WARMUP requests to /bench, then $REQUESTS
# requests to /bench between callgrind_control -z (counters zeroed) and -d
# (dumped). The figure is that window's total / $REQUESTS: every
# instruction the worker spends on those requests (reading, phases,
# variables, our PREACCESS handler, log phase, cleanups, keep-alive, the
# event loop), nothing of start-up, the table load or exit. The handler
# column is the limiter's handler inclusive (preaccess_handler for rate_ctl,
# ngx_http_limit_req_handler, whose key's variable it includes, for
# limit_req; n/a where nginx is stripped, as Debian's is).
#
# (Before: total of a 2,500-request run minus a 500-request run, / 2,000.
# The rate_ctl cases then started loading the table at their first /bench
# request and installed it at whichever request found the helper thread
# done, a point that moves with the machine's load; that changed the
# worker's heap and so the path of nginx's per-request malloc in one run
# and not the other: +/- 250 per request, all in glibc's _int_malloc.)
#
#   scripts/bench-instructions.sh [debian|vendored]
#   env: SKIP_BUILD=1, CASES="plain ratectl grid100", CALLGRIND_ARGS="--dump-instr=yes",
#   REQUESTS=2000, WARMUP=100, KEEP_PROFILES=DIR (keeps the callgrind files
#   for callgrind_annotate: callgrind.CASE.1 is the measured window)
set -euo pipefail
target="${1:-debian}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/bench-table.sh
. "$root/scripts/lib/bench-table.sh"
# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
command -v valgrind >/dev/null || need_packages bench-instructions valgrind
# shellcheck source=scripts/lib/bench-nginx.sh
. "$root/scripts/lib/bench-nginx.sh"
bench_setup "$target" instr
vpid=""
cleanup() {
    if [ -n "$vpid" ]; then kill "$vpid" 2>/dev/null || true; fi
    if [ -n "${KEEP_PROFILES:-}" ] && mkdir -p "$KEEP_PROFILES"; then
        cp "$dir"/callgrind.* "$KEEP_PROFILES"/ 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
# The tables, built only for the cases asked for (a 160,000-strategy
# file takes a few seconds to publish).
export RATE_CTL_TOOL_MAX_STRATEGIES=262144 RATE_CTL_TOOL_SEGMENT_MB=48 RATE_CTL_TOOL_KEYS=1048576
# 100,000 strategies of shapes other than the cases' own, never matching
# the benchmark request (ids from 100,001).
other_shapes() {
    awk 'BEGIN {
        for (i = 0; i < 25000; i++) {
            id = 100001 + 4 * i
            r = "algorithm=token_bucket rate=100 per=second burst=100 when"
            # a shares the request value a5 (i % 300 == 5) with a foreign api
            printf "strategy id=%d %s a=a%d api=/y%d\n", id, r, i % 300, i
            printf "strategy id=%d %s b=b%d c=c%d\n", id + 1, r, i % 300, i
            printf "strategy id=%d %s userid=u%d\n", id + 2, r, i
            printf "strategy id=%d %s a=a%d b=b%d c=c%d\n", id + 3, r, i % 300, i % 290, i
        }
    }'
}
# 10,000 strategies on IPv4 networks of 24 prefix lengths (/8 … /31) and
# an api the request never sends. disjoint: no network holds another; per
# length 1 (/8 … /13), 2^(len-13) (/14 … /22), the rest evenly over /23 …
# /31; 127.0.0.0/24 first (ranges), 127.0.0.0/8 kept empty (ranges_out),
# or 127.0.0.0/8, /16 and /24 (nested).
range_strategies() {
    awk -v kind="$1" '
    # Is net/len disjoint from every network placed? Then place it.
    function place(net, len, emit,   l, s) {
        for (l = 8; l <= len; l++) {
            s = 2 ^ (32 - l)
            if ((l, net - net % s) in taken) return 0
        }
        if ((len, net) in under) return 0
        taken[len, net] = 1
        for (l = 8; l < len; l++) {
            s = 2 ^ (32 - l)
            under[l, net - net % s] = 1
        }
        if (emit) {
            id++
            printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when ip=%d.%d.%d.%d/%d api=/x%d\n", id,
                int(net / 16777216) % 256, int(net / 65536) % 256, int(net / 256) % 256, net % 256, len, id % 50
        }
        return 1
    }
    BEGIN {
        srand(14)
        if (kind == "nested") {
            # The client inside three nested networks (/8, /16, /24).
            for (len = 24; len >= 16; len -= 8) {
                id++
                printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when ip=127.0.0.0/%d api=/x%d\n", id, len, id % 50
            }
            place(127 * 16777216, 8, 1)
        }
        if (kind == "out") place(127 * 16777216, 8, 0)
        else if (kind == "disjoint") place(127 * 16777216, 24, 1)
        left = 10000 - id
        for (len = 8; len < 23; len++) {
            want[len] = len < 13 ? 1 : 2 ^ (len - 13)
            left -= want[len]
        }
        for (len = 23; len < 32; len++) want[len] = int(left / 9) + (len - 23 < left % 9)
        while (id < 10000)
            for (len = 8; len < 32 && id < 10000; len++) {
                if (want[len] == 0) continue
                s = 2 ^ (32 - len)
                addr = (1 + int(rand() * 223)) * 16777216 + int(rand() * 16777216)
                if (place(addr - addr % s, len, 1)) want[len]--
            }
    }'
}
table_for() {
    local kind=$1 n
    case $kind in
    ranges) range_strategies disjoint ;;
    ranges_out) range_strategies out ;;
    ranges_nested) range_strategies nested ;;
    perkey_only | perkey_all | ratectl_only) ;;
    *) background_strategies ;;
    esac
    case ${kind%_bg} in
    ranges | ranges_out | ranges_nested)
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench" ;;
    ratectl_in)
        echo "strategy id=10001 algorithm=token_bucket rate=100 per=second burst=100 when ip=127.0.0.1 api=/x1"
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench" ;;
    prefix)
        awk 'BEGIN {
            for (i = 1; i <= 10000; i++) {
                x = substr("xxx", 1, i % 4)
                printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when api^=/p%d/%s\n", 30000 + i, i, x
            }
        }'
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api^=/ben" ;;
    template)
        awk 'BEGIN {
            for (i = 1; i <= 1000; i++) {
                t = i % 3 == 0 ? "/t" i "/*/x" : i % 3 == 1 ? "/t" i "/*" : "/t" i "/*/**"
                printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when api~=%s\n", 30000 + i, t
            }
        }'
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api~=/bench/**" ;;
    negation)
        awk 'BEGIN {
            for (i = 1; i <= 1000; i++)
                printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when api=/y%d a!=a%d\n", 30000 + i, i, i
        }'
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench a!=a1" ;;
    negation_ref)
        awk 'BEGIN {
            for (i = 1; i <= 1000; i++)
                printf "strategy id=%d algorithm=token_bucket rate=100 per=second burst=100 when api=/y%d a=a%d\n", 30000 + i, i, i
        }'
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench a=a5" ;;
    ratectl | ratectl_only | plain | limitreq | limitreq2)
        echo "strategy id=20001 algorithm=token_bucket rate=1000000 per=second burst=1000000 when api=/bench" ;;
    reject) echo "strategy id=20002 algorithm=fixed_window rate=1 per=day when api=/bench" ;;
    args) echo "strategy id=20003 algorithm=token_bucket rate=1000000 per=second burst=1000000 when a=a5 b=b5" ;;
    # One token an hour, a burst of a million: every request passes and the
    # client's key, once charged, is never reusable during the run.
    perkey | perkey_only) echo "strategy id=20004 algorithm=token_bucket rate=1 per=hour burst=1000000 each=ip when api=/bench" ;;
    # No condition: every request of the location, as limit_req's zone.
    perkey_all) echo "strategy id=20004 algorithm=token_bucket rate=1 per=hour burst=1000000 each=ip" ;;
    count_if) echo "strategy id=20006 algorithm=fixed_window rate=4000000000 per=day count_if=5xx when api=/bench" ;;
    cost_after) echo "strategy id=20007 algorithm=fixed_window rate=4000000000 per=day cost_after=st when api=/bench" ;;
    perkey90)
        echo "strategy id=20004 algorithm=token_bucket rate=1 per=hour burst=1000000 each=ip when api=/bench"
        # The filler: keys that stay limited (not reusable) all day.
        echo "strategy id=20005 algorithm=fixed_window rate=10 per=day each=ip when api=/fill" ;;
    grid*)
        n=${kind%_bg}
        n=${n#grid}
        awk -v n="$n" 'BEGIN {
            for (i = 0; i < n; i++) for (j = 0; j < n; j++)
                printf "strategy id=%d algorithm=token_bucket rate=1000000 per=second burst=1000000 when a=a%d b=b%d\n", 30001 + i * n + j, i, j
        }' ;;
    *) echo "unknown case $kind" >&2 && exit 2 ;;
    esac
    case $kind in *_bg) other_shapes ;; esac
}
# The background strategies as limit_req enforces them: per shape, a map
# from the request's values to the strategy's key (empty, the default: not
# limited) and a zone (other_shapes' rates: 100 r/s, burst 100).
background_maps() {
    awk 'BEGIN {
        print "map_hash_max_size 262144;"
        print "map_hash_bucket_size 128;"
        src[1] = "$arg_a:$uri"; src[2] = "$arg_b:$arg_c"; src[3] = "$arg_u"; src[4] = "$arg_a:$arg_b:$arg_c"
        for (s = 1; s <= 4; s++) {
            printf "map \"%s\" $bg%d {\n", src[s], s
            for (i = 0; i < 25000; i++) {
                id = 100001 + 4 * i + s - 1
                if (s == 1) k = sprintf("a%d:/y%d", i % 300, i)
                else if (s == 2) k = sprintf("b%d:c%d", i % 300, i)
                else if (s == 3) k = sprintf("u%d", i)
                else k = sprintf("a%d:b%d:c%d", i % 300, i % 290, i)
                printf "    \"%s\" s%d;\n", k, id
            }
            print "}"
            printf "limit_req_zone $bg%d zone=bg%d:16m rate=100r/s;\n", s, s
        }
    }'
}
publish_for() {
    local kind=$1
    [ -e "$dir/shm.$kind" ] && return
    table_for "$kind" >"$dir/table.$kind"
    (umask 0 && "$tool" publish "$dir/shm.$kind" "$dir/table.$kind" 1 >/dev/null)
    case $kind in
    perkey90)
        # The client's own key first, then 90 % of the table.
        "$tool" fill-keys "$dir/shm.$kind" 0 api=/bench >&2
        "$tool" fill-keys "$dir/shm.$kind" 943718 api=/fill >&2
        ;;
    esac
}
port=$((30000 + RANDOM % 10000))

# Every case runs the same server: the same two locations, the table
# loaded; only what /bench does differs (so location lookup, URI parsing
# and the worker's heap are alike and the difference is the limiter).
config() {
    local shm=$1 directive=""
    case $1 in
    plain) ;;
    limitreq | limitreq_bg) directive="limit_req zone=one burst=1000000 nodelay;" ;;
    limitreq2 | limitreq2_bg) directive="limit_req zone=two burst=1000000 nodelay;" ;;
    *) directive="rate_ctl on;" ;;
    esac
    case $1 in limitreq*_bg) for s in 1 2 3 4; do directive+=" limit_req zone=bg$s burst=100 nodelay;"; done ;; esac
    # The cases without a table of their own load the friendly one.
    case $1 in plain | limitreq*) shm=ratectl ;; esac
    local maps="" check="" dims=""
    # cost_after reads the final status as its cost (issue 31).
    case $1 in cost_after) dims="rate_ctl_dimension st \$status;" ;; esac
    case $1 in
    limitreq_bg | limitreq2_bg)
        [ -e "$dir/bg-maps.conf" ] || background_maps >"$dir/bg-maps.conf"
        maps="include $dir/bg-maps.conf;"
        # The keys the maps give, checked before the run (see run).
        check="add_header X-Bg \"\$bg1|\$bg2|\$bg3|\$bg4\" always;"
        ;;
    esac
    publish_for "$shm"
    {
        conf_head 1 notice
        echo "master_process off;"
    } >"$dir/nginx.conf"
    cat >>"$dir/nginx.conf" <<CONF
http {
    access_log off;
    rate_ctl_shm $dir/shm.$shm;
    rate_ctl_log_level info;
    rate_ctl_dimension a \$arg_a;
    rate_ctl_dimension b \$arg_b;
    rate_ctl_dimension c \$arg_c;
    rate_ctl_dimension userid \$arg_u;
    $dims
    limit_req_zone \$binary_remote_addr zone=one:1m rate=1000000r/s;
    limit_req_zone \$arg_a\$arg_b zone=two:1m rate=1000000r/s;
    $maps
    server {
        listen 127.0.0.1:$port;
        location /bench { $directive empty_gif; }
        location /other { rate_ctl on; $check empty_gif; }
    }
}
CONF
}

# run CASE -> "TOTAL HANDLER" per request of the measured window (see the
# header: table load, warm-up, then the window between callgrind_control
# -z and -d; HANDLER "-" for plain, "n/a" without the handler's symbol).
run() {
    local case=$1
    local out="$dir/callgrind.$case"
    local cg_args=()
    read -ra cg_args <<<"${CALLGRIND_ARGS:-}"
    : >"$dir/logs/error.log"
    valgrind --tool=callgrind "${cg_args[@]}" --callgrind-out-file="$out" "$nginx" -p "$dir/" -c "$dir/nginx.conf" \
        >/dev/null 2>&1 &
    vpid=$!
    codes=$(python3 - "$port" "$vpid" "$dir/logs/error.log" "${WARMUP:-100}" "${REQUESTS:-2000}" "$case" <<'PY'
import http.client, socket, subprocess, sys, time
port, pid, log, warmup, n, case = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        break
    except OSError:
        time.sleep(0.1)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
def get(path):
    c.request("GET", path)
    resp = c.getresponse()
    resp.read()
    return resp.status
# 1. the table loaded by the helper thread and installed
deadline = time.time() + 300
while "enforcing" not in open(log).read():
    if time.time() > deadline:
        sys.exit("the table was never enforced (error.log)")
    get("/other")
    time.sleep(0.2)
get("/other")
if case in ("limitreq_bg", "limitreq2_bg"):
    # limit_req's background: the maps give a listed combination its
    # strategy's key and the benchmark request none (so it is limited by
    # the background exactly when rate_ctl's table would limit it).
    for path, want in (("/other?a=a7&b=b7&c=c7&u=u7", "|s100030|s100031|s100032"),
                       ("/other?a=a5&b=b5", "|||")):
        c.request("GET", path)
        resp = c.getresponse()
        resp.read()
        if resp.getheader("X-Bg") != want:
            sys.exit(f"{path}: X-Bg {resp.getheader('X-Bg')!r}, expected {want!r}")
# 2. warm-up, 3. the measured window
for _ in range(warmup):
    get("/bench?a=a5&b=b5")
subprocess.run(["callgrind_control", "-z", pid], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
codes = {}
for _ in range(n):
    s = get("/bench?a=a5&b=b5")
    codes[s] = codes.get(s, 0) + 1
subprocess.run(["callgrind_control", "-d", pid], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(" ".join(f"{k}x{v}" for k, v in sorted(codes.items())))
PY
)
    kill -TERM "$vpid" 2>/dev/null || { cat "$dir/logs/error.log" >&2; echo "$case: nginx exited" >&2; }
    wait "$vpid" || true
    vpid=""
    local want="200x${REQUESTS:-2000}"
    [ "$case" != reject ] || want="503x${REQUESTS:-2000}"
    if [ "$codes" != "$want" ]; then
        echo "$case: responses $codes, expected $want" >&2
        exit 1
    fi
    if grep -E '\[(alert|crit|emerg)\]' "$dir/logs/error.log"; then
        echo "$case: error.log has alerts" >&2
        exit 1
    fi
    # The window's dump is the first one (out.1); out itself is the exit's.
    local handler=""
    case $case in
    plain) ;;
    limitreq*) handler=ngx_http_limit_req_handler ;;
    *) handler=preaccess_handler ;;
    esac
    awk -v n="${REQUESTS:-2000}" '/^(summary|totals):/ {printf "%d ", $2 / n; exit}' "$out.1"
    if [ -z "$handler" ]; then
        echo "-"
    else
        callgrind_annotate --inclusive=yes --threshold=100 "$out.1" 2>/dev/null |
            awk -v n="${REQUESTS:-2000}" -v h="$handler" '
                !found && (index($0, ":" h " ") || index($0, ":" h "[")) { gsub(",", "", $1); printf "%d\n", $1 / n; found = 1 }
                END { if (!found) print "n/a" }'
    fi
}

declare -A per hand
read -ra cases <<<"${CASES:-plain limitreq limitreq2 limitreq_bg limitreq2_bg ratectl reject args grid10 grid100 grid250 ratectl_bg args_bg grid10_bg grid100_bg grid250_bg ranges ranges_out ranges_nested}"
for c in "${cases[@]}"; do
    config "$c"
    r=$(run "$c")
    per[$c]=${r% *} hand[$c]=${r#* }
done
echo "nginx: $("$nginx" -v 2>&1 | sed 's/.*version: //'), one worker under callgrind, instructions per request (${REQUESTS:-2000} requests measured after the table load and ${WARMUP:-100} warm-up requests)"
echo
echo "| case | instructions/request | vs plain | handler inclusive |"
echo "|---|---:|---:|---:|"
for c in "${cases[@]}"; do
    base=${per[plain]:-${per[$c]}}
    echo "| $c | ${per[$c]} | $(awk -v a="${per[$c]}" -v b="$base" 'BEGIN { printf "%+d (%+.1f %%)", a - b, 100 * (a - b) / b }') | ${hand[$c]} |"
done
