# shellcheck shell=bash
# Sourced by the scripts that need Debian packages (one install rule for all).
#
#   need_packages WHO PKG...   installs those of PKG that are not installed
#                              (apt-get, through sudo unless root), saying so
#                              on stderr as "WHO: installing …"
need_packages() {
    local who=$1 p sudo=""
    local missing=()
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    echo "$who: installing ${missing[*]}" >&2
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
