#!/usr/bin/env bash
# Installs the Debian packages rate_ctl needs to build and test (idempotent).
# Usage: scripts/deps.sh [--with-test]   (run as root on Debian 12)
set -euo pipefail
pkgs=(ca-certificates curl pkg-config build-essential libclang-dev libpcre2-dev libssl-dev zlib1g-dev nginx nginx-dev)
if [[ "${1:-}" == "--with-test" ]]; then
  pkgs+=(mariadb-server wrk procps lintian systemd dpkg-dev)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's nginx package starts a server on port 80 at install; we never use it.
if systemctl is-active --quiet nginx 2>/dev/null; then systemctl stop nginx || true; fi
if ! command -v cargo >/dev/null; then
  echo "deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
