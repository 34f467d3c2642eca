#!/usr/bin/env bash
# Fleet leases (issue 17): runs tests/fleet_leases.rs's one-machine test
# RUNS times (default 3) and prints the README's "Fleet leases" table from
# its figures; with --write, replaces the table between the
# `<!-- fleet-split:begin -->` / `<!-- fleet-split:end -->` markers in
# README.md.
#
# The test: one `rate-ctl serve` on SQLite, three agents through it (host
# ids h0 h1 h2), a load generator per host deciding requests against that
# host's shared-memory file with the core table (the code nginx workers
# run); a cluster token bucket of 300/s, split: demand, offered 80/15/5 of
# 1.0× and 2.0×, then flipped to 5/15/80; serve killed; a per-day quota of
# 100 with all traffic on h0; serve back; a fourth host joins as h0 dies.
# About 90 s per run.
#
# With --nginx (scripts/lib/fleet-nginx.sh): the same fleet through three
# real vendored nginx instances (target/modules/vendored, built if missing),
# an HTTP load generator per instance, 1.0× and 2.0× only (about 55 s per
# run); --write then fills the `fleet-split-nginx` markers.
#
#   scripts/fleet-split.sh [--nginx] [--write]      env: RUNS=3, PHASE=25 (--nginx)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/fleet-nginx.sh
. scripts/lib/fleet-nginx.sh
write=0 nginx=0
for arg in "$@"; do
    case "$arg" in
    --write) write=1 ;;
    --nginx) nginx=1 ;;
    *)
        echo "usage: $0 [--nginx] [--write]" >&2
        exit 2
        ;;
    esac
done
runs="${RUNS:-3}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for i in $(seq 1 "$runs"); do
    echo "fleet-split: run $i of $runs" >&2
    if [ "$nginx" = 1 ]; then
        run="$( (fleet_nginx_run) 2>&1)"
    else
        run="$(cargo test -q --test fleet_leases demand_split -- --nocapture 2>&1)"
    fi || {
        echo "fleet-split: run $i FAILED:" >&2
        grep -E -A3 'panicked|alert|crit|emerg|not converged' <<<"$run" >&2 || true
        failed=$((${failed:-0} + 1))
    }
    grep -E '^(1\.0x|2\.0x|flip|per-day|serve killed|serve back|h3 joins)' <<<"$run" >>"$out" || true
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
    marker=fleet-split-nginx
    head="${head/| offered/| real nginx: offered}"
    table="$(cat <<TABLE
$head

Admitted per host (h0/h1/h2, 10 s average): $(per_host '1\.0x') at 1.0× (offered
240/45/15); $(per_host '2\.0x') at 2.0× (offered 480/90/30). Offered in total, measured:
$(range '1\.0x' 'offered ([0-9]+)')/s and $(range '2\.0x' 'offered ([0-9]+)')/s. $runs runs of \`scripts/fleet-split.sh --nginx\`${failed:+, $failed of them failed}.
TABLE
)"
else
    marker=fleet-split
    table="$(cat <<TABLE
$head

Flip to 5/15/80: within ±5 % after $(range flip 'after ([0-9]+) s') s. Per-day quota 100, all traffic on
one host: $(range per-day 'admitted \[([0-9]+),') admitted (static: 34). serve killed 11 s then back: within ±5 %
after $(range 'serve back' 'Some\(([0-9]+)\)') s. A fourth host joins as one dies: within ±5 % after
$(range 'h3 joins' 'Some\(([0-9]+)\)') s, highest second $(range 'h3 joins' 'max second ([0-9]+)') (h3 on its static share until its first lease). $runs runs of
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
