#!/usr/bin/env bash
# Fails if Cargo.toml declares a dependency that no source file uses.
#
#   scripts/unused-deps.sh
#
# A [dependencies] crate must be named (crate_name:: or use crate_name) in
# src/ or build.rs; a [dev-dependencies] crate in src/, tests/, benches/ or
# t-nginx/*.rs. Crates used only through a feature of another (e.g.
# ngx/vendored) are still named in the code that uses them. Plain grep, so
# it takes well under a second (cargo-machete does the same, but would have
# to be built first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The names of one [section] of Cargo.toml, one a line.
deps_of() {
    awk -v want="[$1]" '
        /^\[/ { on = ($0 == want); next }
        on && /^[A-Za-z0-9_-]+[ \t]*=/ { sub(/[ \t]*=.*/, ""); print }
    ' Cargo.toml
}

unused=()
check() {
    local section=$1 dep crate
    shift
    while read -r dep; do
        [ -n "$dep" ] || continue
        crate=${dep//-/_}
        if ! grep -rqE "(^|[^A-Za-z0-9_])${crate}::|use ${crate}( |;|::)|extern crate ${crate}" "$@" 2>/dev/null; then
            unused+=("$dep ($section)")
        fi
    done < <(deps_of "$section")
}
check dependencies src build.rs
check dev-dependencies src tests benches t-nginx/tool.rs

if ((${#unused[@]})); then
    echo "unused dependencies in Cargo.toml: ${unused[*]}" >&2
    exit 1
fi
echo "unused-deps: every declared dependency is used"
