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
pkgs=(chromium chromium-driver ca-certificates curl)
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
cd tests/browser
set +e
RATE_CTL_BIN="$root/target/debug/rate-ctl" node --test --test-reporter=spec page.test.mjs 2>&1 |
    tee "$root/target/browser/test-output.txt"
rc=${PIPESTATUS[0]}
set -e
echo "browser-test: artifacts in $root/target/browser/ (screenshot.png, fleet-chart.png, invalid-form.png, hosts.png, audit.png, last.png)"
exit "$rc"
