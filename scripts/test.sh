#!/usr/bin/env bash
# Sets up and runs every test of rate_ctl on a fresh Debian 12 machine (as root):
#   1. Debian packages (scripts/deps.sh --with-test), Rust from the machine's rustup
#   2. cargo fmt --check, unused dependencies, shellcheck, cargo clippy -D warnings
#      (core + binary, and the module), cargo deny check bans licenses sources
#      (scripts/cargo-deny.sh), the layering of src/ (tests/layering.rs: no
#      import cycle between files, which part may name which)
#   3. cargo test: core unit/property/multi-process tests, CLI/store/agent tests
#      against SQLite and throw-away MariaDB and PostgreSQL servers on loopback ports
#   4. the nginx module built for vendored nginx 1.28 and Debian's nginx 1.22,
#      and the curl-driven t-nginx suites against both (prove)
#   5. the admin page in Debian's headless Chromium (playwright-core) against
#      real rate-ctl serve, agent and nginx processes (scripts/browser-test.sh)
#   6. a short cargo-fuzz run of every fuzz target
#   7. the Debian packages: built, lintian, installed into Debian's nginx, run,
#      purged (scripts/package-test.sh)
# Every server it starts is stopped by PID on exit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export CARGO_TERM_COLOR=never
step() { printf '\n==== %s ====\n' "$*"; }

step "dependencies"
scripts/deps.sh --with-test

step "format and lint"
cargo fmt --all -- --check
scripts/unused-deps.sh
shellcheck -x scripts/*.sh scripts/lib/*.sh t-nginx/*.sh
cargo clippy --all-targets -- -D warnings
scripts/cargo-deny.sh
# Also part of `cargo test` below; first here so a layering breach fails fast.
cargo test --test layering

step "cargo test (SQLite, and MariaDB and PostgreSQL on private loopback servers)"
mariadb_dir="$(mktemp -d /tmp/rate-ctl-mariadb-XXXXXX)"
postgres_dir="$(mktemp -d /tmp/rate-ctl-postgres-XXXXXX)"
trap 'scripts/mariadb-test-server.sh stop "$mariadb_dir" || true; scripts/postgres-test-server.sh stop "$postgres_dir" || true' EXIT
RATE_CTL_TEST_MYSQL_URL="$(scripts/mariadb-test-server.sh start "$mariadb_dir")"
export RATE_CTL_TEST_MYSQL_URL
RATE_CTL_TEST_POSTGRES_URL="$(scripts/postgres-test-server.sh start "$postgres_dir")"
export RATE_CTL_TEST_POSTGRES_URL
cargo test --no-fail-fast

step "nginx module: build both targets, lint, t-nginx suites"
scripts/build-module.sh both
NGINX_BUILD_DIR="$root/target-debian/nginx-src/objs" CARGO_TARGET_DIR="$root/target-debian" \
    cargo clippy --release --lib --no-default-features --features module -- -D warnings
t-nginx/run.sh

step "admin page in headless Chromium"
scripts/browser-test.sh

step "fuzz smoke (every target, ${FUZZ_SECONDS:-20} s each)"
scripts/fuzz-smoke.sh

step "Debian packages: build, lintian, install, run, purge"
scripts/package-test.sh

step "done"
echo "all test steps passed"
