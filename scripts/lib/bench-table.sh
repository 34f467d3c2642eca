# shellcheck shell=bash
# Sourced by scripts/bench.sh and scripts/bench-instructions.sh: the 10,000
# strategies both benchmarks load, on clients and URIs the benchmark never
# sends (so they are indexed but never match), one per line in the test
# tool's table syntax. The benchmarks append the strategies they hit.
background_strategies() {
    local i
    for i in $(seq 1 10000); do
        echo "strategy id=$i algorithm=token_bucket rate=100 per=second burst=100 when ip=10.$((i / 65536)).$(((i / 256) % 256)).$((i % 256)) api=/x$((i % 50))"
    done
}
