#!/usr/bin/env bash
# Fleet leases (issue 17): runs the one-machine fleet test RUNS times
# (default 3) and prints the README's table from its figures; with --write,
# replaces the table between its `<!-- MARKER:begin -->` /
# `<!-- MARKER:end -->` markers in README.md.
#
# Without --nginx: tests/fleet_leases.rs (marker `fleet-split`): one
# `rate-ctl serve` on SQLite, three agents through it (host ids h0 h1 h2), a
# load generator per host deciding requests against that host's
# shared-memory file with the core table (the code nginx workers run); a
# cluster token bucket of 300/s, split: demand, offered 80/15/5 of 1.0× and
# 2.0×, then flipped to 5/15/80; serve killed; a per-day quota of 100 with
# all traffic on h0; serve back; a fourth host joins as h0 dies. About 90 s
# per run.
#
# With --nginx: t-nginx/15-fleet-leases.t, the same scenarios through real
# nginx (three instances, a fourth joining, each with its own agent, Perl
# HTTP load generators), with the README's phases: PHASE=25 s per load
# phase, serve killed for OUTAGE=30 s (CI runs the test with 16 s and 11 s).
# About 150 s per run. Marker `fleet-split-nginx-BUILD-STORE`.
#   --build vendored|debian|both   the nginx build of every host (default
#       vendored; both: h0 and h3 vendored 1.28, h1 and h2 Debian 1.22);
#       the module is built with scripts/build-module.sh if missing
#   --store sqlite|mariadb         serve's store (mariadb: a throw-away
#       server from scripts/mariadb-test-server.sh, stopped on exit)
#
#   scripts/fleet-split.sh [--nginx [--build B] [--store S]] [--write]   env: RUNS=3, PHASE, OUTAGE
set -euo pipefail
cd "$(dirname "$0")/.."
write=0 nginx=0 build=vendored store=sqlite
usage() {
    echo "usage: $0 [--nginx [--build vendored|debian|both] [--store sqlite|mariadb]] [--write]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
    --write) write=1 ;;
    --nginx) nginx=1 ;;
    --build)
        build="${2:-}"
        shift
        ;;
    --store)
        store="${2:-}"
        shift
        ;;
    *) usage ;;
    esac
    shift
done
case "$build" in vendored | debian | both) ;; *) usage ;; esac
case "$store" in sqlite | mariadb) ;; *) usage ;; esac
runs="${RUNS:-3}"
out="$(mktemp)"
mariadb_dir=""
cleanup() {
    rm -f "$out"
    [ -z "$mariadb_dir" ] || { scripts/mariadb-test-server.sh stop "$mariadb_dir" && rm -rf "$mariadb_dir"; } || true
}
trap cleanup EXIT
if [ "$nginx" = 1 ]; then
    targets="$build"
    [ "$build" = both ] && targets=vendored,debian
    for b in ${targets//,/ }; do
        [ -f "target/modules/$b/ngx_http_rate_ctl_module.so" ] || scripts/build-module.sh "$b" >&2
    done
    cargo build -q --bin rate-ctl
    unset RATE_CTL_TEST_MYSQL_URL
    if [ "$store" = mariadb ]; then
        mariadb_dir="$(mktemp -d /tmp/rate-ctl-fleet-mariadb-XXXXXX)"
        RATE_CTL_TEST_MYSQL_URL="$(scripts/mariadb-test-server.sh start "$mariadb_dir")"
        export RATE_CTL_TEST_MYSQL_URL
    fi
fi
for i in $(seq 1 "$runs"); do
    echo "fleet-split: run $i of $runs" >&2
    if [ "$nginx" = 1 ]; then
        run="$(RATE_CTL_TARGETS="$targets" FLEET_PHASE="${PHASE:-25}" FLEET_OUTAGE="${OUTAGE:-30}" \
            perl -I t-nginx/lib t-nginx/15-fleet-leases.t 2>&1)"
    else
        run="$(cargo test -q --test fleet_leases demand_split -- --nocapture 2>&1)"
    fi || {
        echo "fleet-split: run $i FAILED:" >&2
        grep -E -A3 'panicked|alert|crit|emerg|not converged|^not ok' <<<"$run" >&2 || true
        failed=$((${failed:-0} + 1))
    }
    grep -E '^(# )?(1\.0x|2\.0x|flip|per-day|serve killed|serve back|h3 joins)' <<<"$run" | sed 's/^# //' >>"$out" || true
done
# range LABEL REGEX: "min–max" of the first number the regex captures.
range() {
    grep -E "^$1" "$out" | RE="$2" perl -ne 'print "$1\n" if /$ENV{RE}/' | sort -n | awk '
        NR == 1 { lo = $1 } { hi = $1 }
        END { if (NR == 0) print "-"; else if (lo == hi) print lo; else print lo "–" hi }'
}
# per_host LABEL: "h0/h1/h2" admitted per second, each a range over the runs.
per_host() {
    echo "$(range "$1" 'per host ([0-9.]+)/')/$(range "$1" 'per host [0-9.]+/([0-9.]+)/')/$(range "$1" 'per host [0-9.]+/[0-9.]+/([0-9.]+)')/s"
}
head="$(cat <<TABLE
| offered (80/15/5 of 300/s) | static split admits | demand split admits (10 s average) | converged after | highest second |
|---|---|---|---|---|
| 1.0× = 300/s | 160/s (53 %) | $(range '1\.0x' '([0-9.]+) % of the rate') % | $(range '1\.0x' 'converged in ([0-9]+) s') s | $(range '1\.0x' 'max second ([0-9]+)') |
| 2.0× = 600/s | 220/s (73 %) | $(range '2\.0x' '([0-9.]+) % of the rate') % | $(range '2\.0x' 'converged in ([0-9]+) s') s | $(range '2\.0x' 'max second ([0-9]+)') |
TABLE
)"
if [ "$nginx" = 1 ]; then
    marker="fleet-split-nginx-$build-$store"
    head="${head/| offered/| real nginx: offered}"
    builds="vendored nginx 1.28"
    [ "$build" = debian ] && builds="Debian nginx 1.22"
    [ "$build" = both ] && builds="h0, h3 vendored nginx 1.28, h1, h2 Debian nginx 1.22"
    store_name=SQLite
    [ "$store" = mariadb ] && store_name=MariaDB
    table="$(cat <<TABLE
$head
| flip to 5/15/80 (2.0×) | 220/s (73 %) | $(range flip '([0-9.]+) % of the rate') % | $(range flip 'converged in ([0-9]+) s') s | $(range flip 'max second ([0-9]+)') |

$builds, serve on $store_name, ${PHASE:-25} s per phase. Admitted per host (h0/h1/h2, 10 s
average): $(per_host '1\.0x') at 1.0× (offered 240/45/15); $(per_host '2\.0x') at 2.0× (offered
480/90/30); $(per_host flip) after the flip (offered 30/90/480). Offered in total, measured:
$(range '1\.0x' 'offered ([0-9]+)')/s and $(range '2\.0x' 'offered ([0-9]+)')/s. serve killed for $(range 'serve killed' 'killed ([0-9]+) s') s: highest second
$(range 'serve killed' 'max second ([0-9]+)'), after the lease expiry every host in every second at least
$(range 'serve killed' 'at least ([0-9]+) %') % of its static share (30/90/100), or of what it was offered if less. serve back: within ±5 % after
$(range 'serve back' 'converged in ([0-9]+) s') s. h3 joins (150/s) as h0 dies: within ±5 % with h3 at ≥ 90/s after
$(range 'h3 joins' 'converged in ([0-9]+) s') s, highest second $(range 'h3 joins' 'max second ([0-9]+)') (h3 on its static share until its first lease). Per-day quota 100, all traffic on h0: $(range per-day 'admitted \[([0-9]+),')
admitted (static: 34). $runs runs of \`scripts/fleet-split.sh --nginx --build $build --store $store\`${failed:+, $failed of them failed}.
TABLE
)"
else
    marker=fleet-split
    table="$(cat <<TABLE
$head

Flip to 5/15/80: within ±5 % after $(range flip 'after ([0-9]+) s') s. Per-day quota 100, all traffic on
one host: $(range per-day 'admitted \[([0-9]+),') admitted (static: 34). serve killed 11 s then back: within ±5 %
after $(range 'serve back' 'converged in ([0-9]+) s') s. A fourth host joins as one dies: within ±5 % after
$(range 'h3 joins' 'converged in ([0-9]+) s') s, highest second $(range 'h3 joins' 'max second ([0-9]+)') (h3 on its static share until its first lease). $runs runs of
\`scripts/fleet-split.sh\`${failed:+, $failed of them failed}.
TABLE
)"
fi
echo "$table"
if [ "$write" = 1 ]; then
    TABLE="$table" MARKER="$marker" perl -0pi -e '
        s/(<!-- $ENV{MARKER}:begin -->\n).*?(<!-- $ENV{MARKER}:end -->)/$1$ENV{TABLE}\n$2/s
            or die "README.md: no $ENV{MARKER} markers\n"' README.md
    echo "fleet-split: README.md updated" >&2
fi
