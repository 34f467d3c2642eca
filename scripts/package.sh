#!/usr/bin/env bash
# Builds the Debian packages of rate_ctl (fresh Debian 12, as root or with sudo):
#
#   scripts/package.sh      → target/debian/libnginx-mod-http-rate-ctl_<version>_<arch>.deb
#                             target/debian/rate-ctl_<version>_<arch>.deb
#   scripts/package.sh --out DIR --profile dev
#       packages into DIR the debug rate-ctl that `cargo build` made (the
#       test command does this: it has that build already; the module is
#       always the release build of scripts/build-module.sh debian)
#
# - libnginx-mod-http-rate-ctl: the module built against Debian's nginx-dev
#   tree (scripts/build-module.sh debian), Depends on the nginx-abi-* virtual
#   package of that tree (read from its debian/libnginx-mod.abisubstvars, as
#   dh_nginx does), enabled through /etc/nginx/modules-enabled like Debian's
#   own libnginx-mod-* packages.
# - rate-ctl: /usr/bin/rate-ctl (release build), rate-ctl-agent.service and
#   rate-ctl-serve.service with /etc/default/rate-ctl-{agent,serve}, the
#   system user rate-ctl (made in postinst, removed on purge).
#
# The files come from scripts/debian/; the packages are assembled with
# dpkg-deb (no debhelper, no cargo-deb). The version is Cargo.toml's
# (a pre-release "-rc.1" becomes "~rc.1", then "-$DEB_REVISION", default 1).
# Timestamps are the last commit's (SOURCE_DATE_EPOCH), owners root, files
# sorted: two builds of one commit give the same file list (and, with the
# same build outputs, the same bytes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tmpl="$root/scripts/debian"
out="$root/target/debian"
profile=release
while (($#)); do
    case "$1" in
    --out) out="$(realpath -m "$2")"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    *)
        echo "usage: $0 [--out DIR] [--profile release|dev]" >&2
        exit 2
        ;;
    esac
done
case "$profile" in
release) cargo_profile=(--release) bin="$root/target/release/rate-ctl" ;;
dev) cargo_profile=() bin="$root/target/debug/rate-ctl" ;;
*)
    echo "--profile: release or dev, not '$profile'" >&2
    exit 2
    ;;
esac
maintainer="${DEB_MAINTAINER:-rate_ctl maintainers <rate-ctl@example.com>}"

log() { echo "package: $*" >&2; }

# --- tools and builds -------------------------------------------------------
scripts/deps.sh
if ! command -v dpkg-shlibdeps >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    log "installing dpkg-dev"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends dpkg-dev >/dev/null
fi
scripts/build-module.sh debian
cargo build "${cargo_profile[@]}" --bin rate-ctl
module_so="$root/target/modules/debian/ngx_http_rate_ctl_module.so"

# --- what the packages say about themselves ---------------------------------
pkgid="$(cargo pkgid)"            # path+file:///…#rate_ctl@0.1.0 (or …#0.1.0)
upstream="${pkgid##*[#@]}"
if ! [[ "$upstream" =~ ^[0-9][0-9A-Za-z.+-]*$ ]]; then
    log "cannot read the version from Cargo.toml (cargo pkgid: $pkgid)"
    exit 1
fi
version="${upstream//-/\~}-${DEB_REVISION:-1}"
arch="$(dpkg --print-architecture)"
if git rev-parse --git-dir >/dev/null 2>&1; then
    commit="$(git rev-parse --short=12 HEAD)"
    git diff --quiet HEAD -- 2>/dev/null || commit="$commit (with uncommitted changes)"
    : "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct)}"
else
    commit="unknown"
    : "${SOURCE_DATE_EPOCH:=$(stat -c %Y Cargo.toml)}"
fi
export SOURCE_DATE_EPOCH
date_r="$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
year="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y)"
deps=""

# The ABI of the nginx tree the module was compiled against (the copy that
# build-module.sh configured), exactly the string dh_nginx puts in Depends.
abifile="$root/target-debian/nginx-src/debian/libnginx-mod.abisubstvars"
abi="$(sed -n 's/^nginx:abi=//p' "$abifile" 2>/dev/null | tr -d '[:space:]')"
if ! [[ "$abi" =~ ^nginx-abi-[0-9A-Za-z.+~-]+$ ]]; then
    log "no nginx:abi=nginx-abi-… line in $abifile (is nginx-dev installed?)"
    exit 1
fi
provides="$(dpkg-query -W -f='${Provides}' nginx 2>/dev/null || true)"
if [ -n "$provides" ] && ! tr ',' '\n' <<<"$provides" | sed 's/ //g' | grep -qx "$abi"; then
    log "warning: the installed nginx provides '$provides', not $abi: the module package will not install next to it"
fi

# Shared-library dependencies, as dh_shlibdeps computes them.
shlibs() {
    local d
    d="$(mktemp -d)"
    mkdir "$d/debian"
    printf 'Source: rate-ctl\n\nPackage: rate-ctl\nArchitecture: any\n' >"$d/debian/control"
    (cd "$d" && dpkg-shlibdeps -O -e"$1" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
    rm -rf "$d"
}

# --- assembling -------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
stage_root="$out/stage"

# put SRC DEST MODE: a file into the package tree.
put() {
    install -D -m "$3" "$1" "$stage/$2"
}
put_stripped() {
    mkdir -p "$(dirname "$stage/$2")"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note -o "$stage/$2" "$1"
    chmod "$3" "$stage/$2"
}
put_gz() { # gzip -n: no name or time in the header
    mkdir -p "$(dirname "$stage/$2")"
    gzip -9nc "$1" >"$stage/$2"
    chmod 0644 "$stage/$2"
}
subst() {
    sed -e "s|@VERSION@|$version|g" -e "s|@ARCH@|$arch|g" -e "s|@MAINTAINER@|$maintainer|g" \
        -e "s|@YEAR@|$year|g" \
        -e "s|@NGINX_ABI@|$abi|g" -e "s|@SHLIBS@|$deps|g" -e "s|@SIZE@|${size:-0}|g" "$1"
}
begin() {
    pkg="$1"
    stage="$stage_root/$pkg"
    mkdir -p "$stage/DEBIAN"
    {
        echo "$pkg ($version) unstable; urgency=medium"
        echo
        echo "  * Built by scripts/package.sh from the rate_ctl repository."
        echo "  * Commit $commit."
        [ "$profile" = release ] || echo "  * rate-ctl from the cargo $profile profile (a test build)."
        echo
        echo " -- $maintainer  $date_r"
    } >"$out/changelog"
    put_gz "$out/changelog" "usr/share/doc/$pkg/changelog.Debian.gz"
    rm -f "$out/changelog"
    subst "$tmpl/copyright" >"$out/copyright"
    put "$out/copyright" "usr/share/doc/$pkg/copyright" 0644
    rm -f "$out/copyright"
    if [ -f "$tmpl/$pkg/lintian-overrides" ]; then
        put "$tmpl/$pkg/lintian-overrides" "usr/share/lintian/overrides/$pkg" 0644
    fi
}
finish() {
    local conffiles=()
    [ -f "$stage/DEBIAN/conffiles" ] && mapfile -t conffiles <"$stage/DEBIAN/conffiles"
    (
        cd "$stage"
        # md5sums of everything but the conffiles (dpkg keeps theirs itself).
        find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | LC_ALL=C sort |
            while read -r f; do
                printf '%s\n' "${conffiles[@]}" | grep -qxF "/$f" || md5sum "$f"
            done >DEBIAN/md5sums
    )
    size="$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)"
    subst "$tmpl/$pkg/control.in" >"$stage/DEBIAN/control"
    find "$stage" -type d -exec chmod 0755 {} +
    find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    local deb="$out/${pkg}_${version}_${arch}.deb"
    dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
    log "$(basename "$deb") ($(stat -c %s "$deb") bytes)"
}

# The module package, laid out as dh_nginx does for Debian's libnginx-mod-*.
begin libnginx-mod-http-rate-ctl
put_stripped "$module_so" usr/lib/nginx/modules/ngx_http_rate_ctl_module.so 0644
put "$tmpl/$pkg/mod-http-rate-ctl.conf" usr/share/nginx/modules-available/mod-http-rate-ctl.conf 0644
for s in postinst prerm postrm; do put "$tmpl/$pkg/$s" "DEBIAN/$s" 0755; done
deps="$(shlibs "$stage/usr/lib/nginx/modules/ngx_http_rate_ctl_module.so")"
finish

# The agent / admin service / CLI package.
begin rate-ctl
put_stripped "$bin" usr/bin/rate-ctl 0755
for u in rate-ctl-agent.service rate-ctl-serve.service; do put "$tmpl/$pkg/$u" "lib/systemd/system/$u" 0644; done
# 0640: they may hold a store password or a token (postinst gives them to
# the group rate-ctl once the group exists).
for d in rate-ctl-agent rate-ctl-serve; do put "$tmpl/$pkg/default/$d" "etc/default/$d" 0640; done
subst "$tmpl/$pkg/rate-ctl.1" >"$out/rate-ctl.1"
put_gz "$out/rate-ctl.1" usr/share/man/man1/rate-ctl.1.gz
rm -f "$out/rate-ctl.1"
put_gz README.md "usr/share/doc/$pkg/README.md.gz"
put_gz docs/API.md "usr/share/doc/$pkg/API.md.gz"
# Imported as is into Grafana, so not compressed and not under doc/.
put docs/grafana-dashboard.json "usr/share/$pkg/grafana-dashboard.json" 0644
put "$tmpl/$pkg/conffiles" DEBIAN/conffiles 0644
for s in postinst prerm postrm; do put "$tmpl/$pkg/$s" "DEBIAN/$s" 0755; done
deps="$(shlibs "$stage/usr/bin/rate-ctl")"
finish

rm -rf "$stage_root"
ls -l "$out"/*.deb
