#!/usr/bin/env bash
# Builds the module for both nginx targets and the table tool, then runs
# every t-nginx suite with prove.  Usage: t-nginx/run.sh [prove args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
need_packages t-nginx curl perl openssl libio-socket-ssl-perl
scripts/build-module.sh "${RATE_CTL_BUILD:-both}"
cargo build --example rate-ctl-test-tool --bin rate-ctl
exec prove -I t-nginx/lib "${@:-t-nginx/}"
