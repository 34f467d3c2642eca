#!/usr/bin/env bash
# End to end propagation (issue 29), the strict figure: `rate-ctl strategy
# add` returned → every one of 8 keep-alive connections to a 2-worker nginx
# answers 503, with N other strategies in the store, 12 trials; the
# largest must be at most MAX_MS (20 ms; 50 ms for MariaDB). Runs
# t-nginx/43-propagation.t with the release binary, for each store given:
#
#   scripts/propagation.sh [sqlite] [postgres] [serve] [mariadb]
#       env: N=10000 (e.g. N=10, N=65536) TARGETS=vendored (or vendored,debian)
#            MAX_MS, TRIALS=12, SKIP_BUILD=1
#
# PostgreSQL and MariaDB: private servers on loopback ports started here
# (scripts/postgres-test-server.sh, scripts/mariadb-test-server.sh) and
# stopped on exit, unless RATE_CTL_TEST_POSTGRES_URL / RATE_CTL_TEST_MYSQL_URL
# name one (the test replaces its strategies).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(sqlite postgres serve)
if [ -z "${SKIP_BUILD:-}" ]; then
    cargo build --release --bin rate-ctl
    cargo build --example rate-ctl-test-tool
    scripts/build-module.sh "${TARGETS:-vendored}" | grep -v '^$' || true
fi
export RATE_CTL_BIN="$root/target/release/rate-ctl"
export RATE_CTL_TARGETS="${TARGETS:-vendored}"
export PROPAGATION_N="${N:-10000}" PROPAGATION_TRIALS="${TRIALS:-12}"
dirs=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    for d in "${dirs[@]}"; do
        case "$d" in
        *postgres*) scripts/postgres-test-server.sh stop "$d" || true ;;
        *mariadb*) scripts/mariadb-test-server.sh stop "$d" || true ;;
        esac
        rm -rf "$d"
    done
}
trap cleanup EXIT
status=0
for s in "${stores[@]}"; do
    bound="${MAX_MS:-20}"
    case "$s" in
    postgres)
        if [ -z "${RATE_CTL_TEST_POSTGRES_URL:-}" ]; then
            d="$(mktemp -d /tmp/rate-ctl-propagation-postgres-XXXXXX)"
            dirs+=("$d")
            RATE_CTL_TEST_POSTGRES_URL="$(scripts/postgres-test-server.sh start "$d")"
            export RATE_CTL_TEST_POSTGRES_URL
        fi
        ;;
    mariadb)
        bound="${MAX_MS:-50}"
        if [ -z "${RATE_CTL_TEST_MYSQL_URL:-}" ]; then
            d="$(mktemp -d /tmp/rate-ctl-propagation-mariadb-XXXXXX)"
            dirs+=("$d")
            RATE_CTL_TEST_MYSQL_URL="$(scripts/mariadb-test-server.sh start "$d")"
            export RATE_CTL_TEST_MYSQL_URL
        fi
        ;;
    sqlite | serve) ;;
    *)
        echo "usage: $0 [sqlite] [postgres] [serve] [mariadb]" >&2
        exit 2
        ;;
    esac
    echo "== $s: N=$PROPAGATION_N, bound $bound ms =="
    PROPAGATION_STORE="$s" PROPAGATION_MAX_MS="$bound" \
        prove -v -I t-nginx/lib t-nginx/43-propagation.t 2>&1 |
        grep -E '^\s*(ok|not ok|# propagation:|# trials)' || status=1
done
exit "$status"
