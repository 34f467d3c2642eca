#!/usr/bin/env bash
# Installs the Debian packages rate_ctl needs to build and test (idempotent).
# Usage: scripts/deps.sh [--with-test]   (run as root on Debian 12)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
pkgs=(ca-certificates curl pkg-config build-essential libclang-dev libpcre2-dev libssl-dev zlib1g-dev nginx nginx-dev)
if [[ "${1:-}" == "--with-test" ]]; then
  # openssl: tests/serve_tls.rs makes its CA and server certificate with the CLI.
  pkgs+=(mariadb-server wrk procps shellcheck lintian systemd dpkg-dev openssl)
fi
need_packages deps "${pkgs[@]}"
# Debian's nginx package starts a server on port 80 at install; we never use it.
if systemctl is-active --quiet nginx 2>/dev/null; then systemctl stop nginx || true; fi
if ! command -v cargo >/dev/null; then
  echo "deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
