#!/usr/bin/env bash
# Build ngx_http_rate_ctl_module.so for one or both nginx targets.
#
#   scripts/build-module.sh [vendored|debian|both]     (default: both)
#
# vendored: nginx 1.28 from the nginx-src crate (ngx's `vendored` feature);
#           the nginx binary it builds is copied next to the module.
# debian:   Debian 12's packaged nginx 1.22 (/usr/sbin/nginx), built against
#           the nginx-dev source tree configured with the package's flags.
#
# A module only loads into the nginx version it was built against, so each
# target gets its own CARGO_TARGET_DIR. Results:
#   target/modules/vendored/ngx_http_rate_ctl_module.so  + target/modules/vendored/nginx
#   target/modules/debian/ngx_http_rate_ctl_module.so     (load into /usr/sbin/nginx)
set -euo pipefail

which="${1:-both}"
case "$which" in
vendored | debian | both) ;;
*)
    echo "usage: $0 [vendored|debian|both]" >&2
    exit 2
    ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="$root/target/modules"

# shellcheck source=scripts/lib/packages.sh
. "$root/scripts/lib/packages.sh"
need_pkgs() { need_packages build-module "$@"; }

common_pkgs=(build-essential libclang-dev libpcre2-dev libssl-dev zlib1g-dev)

build_vendored() {
    # auth_request is not in nginx-src's default set; Debian's nginx has it, and
    # the subrequest tests (t-nginx/08-nginx-semantics.t) use it in both builds.
    export NGX_CONFIGURE_ARGS="${NGX_CONFIGURE_ARGS:---with-http_auth_request_module}"
    need_pkgs "${common_pkgs[@]}"
    echo "== vendored nginx 1.28 ==" >&2
    CARGO_TARGET_DIR="$root/target-vendored" \
        cargo build --release --lib --no-default-features --features vendored
    mkdir -p "$out/vendored"
    install -m 0644 "$root/target-vendored/release/librate_ctl.so" "$out/vendored/ngx_http_rate_ctl_module.so"
    # The nginx binary built by nginx-sys; pick the newest if several builds exist.
    local bin
    bin="$(find "$root"/target-vendored/release/build -path '*nginx-sys-*/out/*' -name nginx -type f -perm -u+x -printf '%T@ %p\n' |
        sort -nr | head -n1 | cut -d' ' -f2-)"
    if [ -z "$bin" ]; then
        echo "error: vendored nginx binary not found under target-vendored/release/build/nginx-sys-*/out/" >&2
        exit 1
    fi
    install -m 0755 "$bin" "$out/vendored/nginx"
    echo "vendored module: $out/vendored/ngx_http_rate_ctl_module.so"
    echo "vendored nginx:  $out/vendored/nginx ($("$out/vendored/nginx" -v 2>&1))"
}

build_debian() {
    need_pkgs "${common_pkgs[@]}" nginx nginx-dev
    echo "== Debian nginx $(/usr/sbin/nginx -v 2>&1 | sed 's/.*nginx\///') ==" >&2
    local src="$root/target-debian/nginx-src"
    # Re-configure only when the packaged source changed (or was never configured).
    local stamp="$src/.rate_ctl-configured"
    local pkgver
    pkgver="$(dpkg-query -W -f='${Version}' nginx-dev)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$pkgver" ]; then
        rm -rf "$src"
        mkdir -p "$src"
        cp -a /usr/share/nginx/src/. "$src/"
        (
            cd "$src"
            # shellcheck disable=SC1091
            source ./conf_flags
            ./configure "${NGX_CONF_FLAGS[@]}" >configure.log 2>&1 || {
                tail -n 30 configure.log >&2
                exit 1
            }
        )
        echo "$pkgver" >"$stamp"
    fi
    NGINX_BUILD_DIR="$src/objs" CARGO_TARGET_DIR="$root/target-debian" \
        cargo build --release --lib --no-default-features --features module
    mkdir -p "$out/debian"
    install -m 0644 "$root/target-debian/release/librate_ctl.so" "$out/debian/ngx_http_rate_ctl_module.so"
    echo "debian module:   $out/debian/ngx_http_rate_ctl_module.so (load into /usr/sbin/nginx)"
}

case "$which" in
vendored) build_vendored ;;
debian) build_debian ;;
both)
    build_vendored
    build_debian
    ;;
esac
