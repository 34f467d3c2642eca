# shellcheck shell=bash
# Sourced by the nginx benchmarks (bench-instructions.sh, bench-publish.sh):
# the module and nginx of one target, the table tool, a scratch directory.

# bench_setup TARGET NAME: builds the module (unless SKIP_BUILD is set) and
# the table tool; sets $tool, $nginx, $module and $dir (a new directory
# /tmp/rate_ctl_NAME_*, with logs/, readable by nginx's workers). The
# caller sets $root (the repository) and works there.
# shellcheck disable=SC2034,SC2154 # $root and the variables set are the caller's
bench_setup() {
    local target=$1 name=$2
    [ -n "${SKIP_BUILD:-}" ] || scripts/build-module.sh "$target" >&2
    cargo build -q --example rate-ctl-test-tool
    tool="$root/target/debug/examples/rate-ctl-test-tool"
    if [ "$target" = vendored ]; then nginx="$root/target/modules/vendored/nginx"; else nginx=/usr/sbin/nginx; fi
    module="$root/target/modules/$target/ngx_http_rate_ctl_module.so"
    dir="$(mktemp -d "/tmp/rate_ctl_${name}_XXXXXX")"
    chmod 0755 "$dir"
    mkdir -p "$dir/logs"
}

# conf_head WORKERS LOG_LEVEL: the main context of a benchmark's nginx.conf
# (module loaded, one process tree in $dir, in the foreground).
conf_head() {
    printf 'load_module %s;\nworker_processes %s;\ndaemon off;\npid %s/nginx.pid;\nerror_log %s/logs/error.log %s;\nevents { worker_connections 64; }\n' \
        "$module" "$1" "$dir" "$dir" "$2"
}
