#!/usr/bin/env bash
# Builds every cargo-fuzz target in fuzz/ and runs each for a short, bounded
# time. Exits non-zero when a build fails or a target finds a crash (the
# reproducer is left in fuzz/artifacts/<target>/).
#
#   scripts/fuzz-smoke.sh            # 20 s per target
#   FUZZ_SECONDS=300 scripts/fuzz-smoke.sh
#   FUZZ_SANITIZER=none scripts/fuzz-smoke.sh   # without AddressSanitizer
#
# cargo-fuzz passes nightly-only flags (-Zsanitizer=...). Only the stable
# toolchain exists here, so RUSTC_BOOTSTRAP=1 lets stable rustc accept them;
# the stable toolchain ships the ASan runtime, so the default address
# sanitizer works too.
set -euo pipefail

seconds=${FUZZ_SECONDS:-20}
sanitizer=${FUZZ_SANITIZER:-address}
cd "$(dirname "$0")/../fuzz"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked --version '^0.13'
fi

export RUSTC_BOOTSTRAP=1
# -a: debug assertions, so integer overflow is a crash too.
flags=(--sanitizer "$sanitizer" --debug-assertions)

mapfile -t targets < <(cargo fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz-smoke: no fuzz targets found" >&2
    exit 1
fi
cargo fuzz build "${flags[@]}"

for t in "${targets[@]}"; do
    echo "fuzz-smoke: $t for ${seconds}s" >&2
    mkdir -p "corpus/$t"
    mkdir -p target
    log="target/fuzz-$t.log"
    # libFuzzer reports every new input; keep that in a log, show the end.
    if ! cargo fuzz run "${flags[@]}" "$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "fuzz-smoke: $t FAILED, reproducer in fuzz/artifacts/$t/, log $PWD/$log" >&2
        exit 1
    fi
    grep -E "^stat::number_of_executed_units|^Done " "$log" >&2 || true
done
echo "fuzz-smoke: all ${#targets[@]} targets ran ${seconds}s without a crash" >&2
