#!/usr/bin/env bash
# Browser test of the admin page (issue 5): Debian's headless Chromium,
# driven by playwright-core, against real `rate-ctl serve` (SQLite),
# `rate-ctl agent --store http://…` and the vendored nginx with the module.
#
#   scripts/browser-test.sh        (as root on a fresh Debian 12, or with sudo)
#
# Installs chromium, chromium-driver and nodejs/npm if missing (never
# `npx playwright install`: the browser is Debian's /usr/bin/chromium), runs
# `npm ci` in tests/browser, builds rate-ctl and the vendored module, then runs
# `node --test`. Artifacts: target/browser/*.png (screenshot.png is the page
# with a live chart), test output in target/browser/test-output.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
pkgs=(chromium chromium-driver ca-certificates curl openssl)
# Any node >= 18 with npm will do (Debian 12 ships 18.19).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    pkgs+=(nodejs npm)
fi
need_packages browser-test "${pkgs[@]}"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if ((node_major < 18)); then
    echo "browser-test: node $(node --version) is too old (need >= 18)" >&2
    exit 1
fi

scripts/deps.sh
(cd tests/browser && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund)
cargo build --bin rate-ctl
scripts/build-module.sh vendored

mkdir -p target/browser
# serve over HTTPS (issue 34): a test CA and a certificate for 127.0.0.1,
# made here so that node can trust the CA from its start; Chromium is given
# the SHA-256 of the server's public key (it trusts that key only).
tls="$root/target/browser/tls"
rm -rf "$tls" && mkdir -p "$tls"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$tls/ca.key" -out "$tls/ca.pem" -days 2 -subj "/CN=rate_ctl browser test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req "${ec[@]}" -keyout "$tls/server.key" -out "$tls/server.csr" -subj /CN=127.0.0.1 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' >"$tls/ext.cnf"
openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
    -out "$tls/server.pem" -days 2 -extfile "$tls/ext.cnf" 2>/dev/null
spki="$(openssl x509 -in "$tls/server.pem" -pubkey -noout | openssl pkey -pubin -outform der |
    openssl dgst -sha256 -binary | base64)"
export RATE_CTL_TEST_TLS_DIR="$tls" RATE_CTL_TEST_TLS_SPKI="$spki" NODE_EXTRA_CA_CERTS="$tls/ca.pem"
cd tests/browser
set +e
RATE_CTL_BIN="$root/target/debug/rate-ctl" node --test --test-reporter=spec page.test.mjs 2>&1 |
    tee "$root/target/browser/test-output.txt"
rc=${PIPESTATUS[0]}
set -e
echo "browser-test: artifacts in $root/target/browser/ (screenshot.png, fleet-chart.png, invalid-form.png, hosts.png, audit.png, last.png)"
exit "$rc"
