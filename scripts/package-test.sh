#!/usr/bin/env bash
# Test of the Debian packages (issue 18), run by scripts/test.sh. As root on
# Debian 12; no systemd as PID 1 is needed (what needs it is said below).
#
#   1. scripts/package.sh twice: the same file lists (and the same bytes).
#      Into a temp dir, and with the debug rate-ctl the test command built
#      already (PACKAGE_TEST_PROFILE=release packages the release build, as
#      scripts/package.sh does by default: a few minutes more on 2 cores)
#   2. lintian on both packages: the tags are printed, errors fail
#   3. the module refuses an nginx with another ABI (apt-get -s, a dummy
#      "nginx" package built here with dpkg-deb, providing another nginx-abi-*)
#   4. apt-get install ./both.deb into the machine's Debian nginx; the module
#      is enabled by the package and `nginx -t` passes; systemd-analyze
#      verify (and security --offline) on both units; the agent is enabled,
#      serve is not; the user rate-ctl is in www-data
#   5. the units' ExecStart lines run as the units' user with the packaged
#      /etc/default files (RuntimeDirectory= and ExecStartPre= done as
#      systemd does them), /usr/sbin/nginx as www-data on a free loopback port
#      loading the packaged module through /etc/nginx/modules-enabled; a
#      strategy added with `rate-ctl` (through serve's API) is enforced: 503s,
#      counted in the table and in serve's /metrics, and still there after
#      the agent restarts (its directory kept); every series the
#      packaged Grafana dashboard queries exists
#   6. dpkg --purge both: module link, user, group, store, table and files
#      gone, `nginx -t` still passes, and the files the packages touch are as
#      before the test
#
# The machine is left as found: the test refuses to start if rate-ctl is
# installed or its user, store or table exist, stops what it started by PID
# and purges both packages on any exit. apt and dpkg logs keep their lines.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -o APT::Sandbox::User=root)
t0=$SECONDS

say() { printf '\n---- package-test: %s\n' "$*"; }
fail() {
    echo "package-test: FAIL: $*" >&2
    exit 1
}
ok() { echo "ok - $*"; }

[ "$(id -u)" -eq 0 ] || fail "run as root (it installs and purges packages)"
for p in lintian systemd dpkg-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        fail "Debian package $p missing (scripts/deps.sh --with-test installs it)"
done

pkgs=(rate-ctl libnginx-mod-http-rate-ctl)
for p in "${pkgs[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qv "not-installed"; then
        fail "$p is installed on this machine; the test installs and purges it (dpkg --purge $p first)"
    fi
done
getent passwd rate-ctl >/dev/null && fail "user rate-ctl exists (left by something else?)"
[ -e /dev/shm/rate_ctl ] && fail "/dev/shm/rate_ctl exists (an agent running?)"
[ -e /run/rate-ctl ] && fail "/run/rate-ctl exists (an agent running?)"
# Without the package and its user, a /var/lib/rate-ctl is something else's
# (serve on a MariaDB or PostgreSQL store writes its default admin.token
# there): kept aside under a sibling name and put back on exit.
saved=""
if [ -e /var/lib/rate-ctl ]; then
    saved="/var/lib/rate-ctl.package-test-saved.$$"
    mv /var/lib/rate-ctl "$saved"
    echo "package-test: /var/lib/rate-ctl kept aside as $saved until the end" >&2
fi

tmp="$(mktemp -d /tmp/rate-ctl-package-test-XXXXXX)"
chmod 0755 "$tmp"
pids=()
installed=false
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    restore() {
        if [ -n "$saved" ]; then
            rm -rf /var/lib/rate-ctl
            mv "$saved" /var/lib/rate-ctl
        fi
    }
    if ((rc != 0)); then
        for f in "$tmp"/*.log "$tmp"/nginx/logs/*.log; do
            [ -s "$f" ] && { echo "== $f (last lines)"; tail -n 15 "$f"; }
        done
    fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if $installed; then
        echo "package-test: purging ${pkgs[*]}" >&2
        dpkg --purge "${pkgs[@]}" >/dev/null 2>&1 || true
    fi
    restore
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# What the packages may touch, with modes and owners (no times); compared
# after the purge.
snapshot() {
    {
        find /etc/nginx /etc/default /etc/systemd/system /lib/systemd/system /usr/lib/nginx \
            /usr/share/nginx/modules-available /var/lib/systemd/deb-systemd-helper-enabled \
            /var/lib/systemd/deb-systemd-helper-masked /var/lib/rate-ctl /usr/bin/rate-ctl \
            /usr/share/doc/rate-ctl /usr/share/doc/libnginx-mod-http-rate-ctl \
            /usr/share/man/man1/rate-ctl.1.gz /dev/shm/rate_ctl /dev/shm/rate_ctl.state /dev/shm/.rate_ctl.tmp.* /run/rate-ctl \
            -printf '%p %M %u %g %l\n' 2>/dev/null || true
        find /var/lib/dpkg/info -maxdepth 1 \( -name 'rate-ctl[.:]*' -o -name 'libnginx-mod-http-rate-ctl[.:]*' \) \
            -printf '%f\n' 2>/dev/null || true
        getent passwd rate-ctl || true
        getent group rate-ctl www-data || true
    } | LC_ALL=C sort
}
snapshot >"$tmp/before"

# ---------------------------------------------------------------------------
say "1. build both packages (twice: same file list)"
t=$SECONDS
profile="${PACKAGE_TEST_PROFILE:-dev}"
out="$tmp/debian"
scripts/package.sh --out "$out" --profile "$profile"
debs=("$out"/*.deb)
((${#debs[@]} == 2)) || fail "expected 2 packages in target/debian, got: ${debs[*]}"
version="$(cargo pkgid)"
version="${version##*[#@]}"
for d in "${debs[@]}"; do
    dpkg-deb -c "$d" | awk '{print $1, $2, $3, $6, $7, $8}' >"$tmp/$(basename "$d").list1"
    sha256sum "$d" >>"$tmp/sha1"
    [[ "$(dpkg-deb -f "$d" Version)" == "${version//-/\~}-"* ]] ||
        fail "$d: Version $(dpkg-deb -f "$d" Version) does not follow Cargo.toml's $version"
done
ok "version $(dpkg-deb -f "${debs[0]}" Version) from Cargo.toml ($version)"
first_build=$((SECONDS - t))
scripts/package.sh --out "$out" --profile "$profile" >/dev/null 2>"$tmp/build2.log" || {
    cat "$tmp/build2.log"
    fail "second build"
}
for d in "${debs[@]}"; do
    dpkg-deb -c "$d" | awk '{print $1, $2, $3, $6, $7, $8}' >"$tmp/$(basename "$d").list2"
    diff -u "$tmp/$(basename "$d").list1" "$tmp/$(basename "$d").list2" ||
        fail "$(basename "$d"): the second build has another file list"
    sha256sum "$d" >>"$tmp/sha2"
done
ok "two builds, same file lists (modes, owners, paths, times)"
if cmp -s "$tmp/sha1" "$tmp/sha2"; then ok "two builds, same bytes"; else echo "note: the bytes differ (same file lists)"; fi
mod_deb="$(ls "$out"/libnginx-mod-http-rate-ctl_*.deb)"
bin_deb="$(ls "$out"/rate-ctl_*.deb)"
for d in "$mod_deb" "$bin_deb"; do
    echo "$(basename "$d"): Depends: $(dpkg-deb -f "$d" Depends)"
    dpkg-deb -c "$d" | awk '$1 !~ /^d/ {print "  " $6}'
done

abi="$(sed -n 's/^nginx:abi=//p' /usr/share/nginx/src/debian/libnginx-mod.abisubstvars | tr -d '[:space:]')"
dpkg-deb -f "$mod_deb" Depends | tr ',' '\n' | sed 's/ //g' | grep -qx "$abi" ||
    fail "the module package does not depend on $abi (nginx-dev's ABI)"
dpkg-query -W -f='${Provides}' nginx | tr ',' '\n' | sed 's/ //g' | grep -qx "$abi" ||
    fail "the installed nginx does not provide $abi"
ok "module Depends: $abi, which the installed nginx $(dpkg-query -W -f='${Version}' nginx) provides"

# ---------------------------------------------------------------------------
say "2. lintian (errors fail, other tags are reported)"
set +e
lintian --fail-on error --display-info --tag-display-limit 0 "$mod_deb" "$bin_deb" >"$tmp/lintian.txt" 2>&1
lintian_rc=$?
set -e
grep -v '^warning: running with root privileges' "$tmp/lintian.txt" || true
((lintian_rc == 0)) || fail "lintian reported errors (exit $lintian_rc)"
ok "lintian: no errors ($(grep -c '^[WIP]:' "$tmp/lintian.txt" || true) other tags)"

# ---------------------------------------------------------------------------
say "3. an nginx with another ABI is refused"
# A dummy "nginx", newer than the installed one, providing another ABI: as if
# the operator had an nginx built with other options (or a future upgrade).
# apt-get -s only simulates: nothing is installed.
nginx_version="$(dpkg-query -W -f='${Version}' nginx)"
mkdir -p "$tmp/dummy/DEBIAN"
cat >"$tmp/dummy/DEBIAN/control" <<EOF
Package: nginx
Version: ${nginx_version}+rate-ctl-abi-test1
Architecture: $(dpkg --print-architecture)
Maintainer: rate_ctl package test <rate-ctl@example.com>
Provides: nginx-abi-0.0.0-0
Description: dummy nginx with another module ABI (rate_ctl package test)
EOF
dpkg-deb --root-owner-group --build "$tmp/dummy" "$tmp/nginx-other-abi.deb" >/dev/null
chmod 0644 "$tmp/nginx-other-abi.deb"
apt-get -s "${apt_opts[@]}" install "$mod_deb" "$bin_deb" >"$tmp/apt-ok.txt" 2>&1 ||
    {
        cat "$tmp/apt-ok.txt"
        fail "apt-get -s install of both packages next to the real nginx failed"
    }
grep -q '^Inst libnginx-mod-http-rate-ctl ' "$tmp/apt-ok.txt" || fail "apt-get -s did not plan the module"
ok "apt-get -s install of both next to nginx $nginx_version ($abi): accepted"
if apt-get -s "${apt_opts[@]}" install "$tmp/nginx-other-abi.deb" "$mod_deb" >"$tmp/apt-abi.txt" 2>&1; then
    cat "$tmp/apt-abi.txt"
    fail "apt accepted the module next to an nginx providing nginx-abi-0.0.0-0"
fi
grep "libnginx-mod-http-rate-ctl : Depends: $abi" "$tmp/apt-abi.txt" ||
    {
        cat "$tmp/apt-abi.txt"
        fail "apt refused, but not for the module's $abi"
    }
ok "apt-get -s install of the module next to an nginx providing nginx-abi-0.0.0-0: refused"

# ---------------------------------------------------------------------------
say "4. apt-get install ./both.deb into the machine's nginx"
installed=true
apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "$mod_deb" "$bin_deb" >"$tmp/apt-install.txt" 2>&1 || {
    cat "$tmp/apt-install.txt"
    fail "apt-get install"
}
grep -E '^(Setting up|Unpacking) ' "$tmp/apt-install.txt" || true
link=/etc/nginx/modules-enabled/50-mod-http-rate-ctl.conf
[ "$(readlink "$link")" = /usr/share/nginx/modules-available/mod-http-rate-ctl.conf ] ||
    fail "$link is not the package's link"
grep -qx 'load_module modules/ngx_http_rate_ctl_module.so;' "$(readlink "$link")" || fail "load_module line"
ok "$link → $(readlink "$link")"
/usr/sbin/nginx -t 2>&1 | tee "$tmp/nginx-t.txt"
grep -q 'test is successful' "$tmp/nginx-t.txt" || fail "nginx -t after install"
# nginx -T shows the configuration nginx -t checked: the module is in it.
# Into a file first: `nginx -T | grep -q` under pipefail fails whenever grep
# exits on its match before nginx has written the rest (SIGPIPE, 141).
/usr/sbin/nginx -T >"$tmp/nginx-T.txt" 2>/dev/null || fail "nginx -T after install"
grep -q '^load_module modules/ngx_http_rate_ctl_module.so;' "$tmp/nginx-T.txt" ||
    fail "nginx -T does not show the module's load_module line"
ok "nginx -t passes with the module enabled by the package (no edit)"

id -nG rate-ctl | tr ' ' '\n' | grep -qx www-data || fail "rate-ctl is not in www-data"
[ "$(getent passwd rate-ctl | cut -d: -f7)" = /usr/sbin/nologin ] || fail "rate-ctl has a login shell"
[ "$(stat -c '%U:%G %a' /var/lib/rate-ctl)" = "rate-ctl:rate-ctl 750" ] ||
    fail "/var/lib/rate-ctl is $(stat -c '%U:%G %a' /var/lib/rate-ctl)"
ok "system user $(id rate-ctl); /var/lib/rate-ctl rate-ctl:rate-ctl 0750"
dpkg-query -W -f='${Conffiles}\n' rate-ctl | grep -q '/etc/default/rate-ctl-agent' || fail "conffiles"
dpkg-query -W -f='${Conffiles}\n' rate-ctl | grep -q '/etc/default/rate-ctl-serve' || fail "conffiles"
ok "conffiles: /etc/default/rate-ctl-agent, /etc/default/rate-ctl-serve"
for f in /etc/default/rate-ctl-agent /etc/default/rate-ctl-serve; do
    [ "$(stat -c '%U:%G %a' "$f")" = "root:rate-ctl 640" ] ||
        fail "$f is $(stat -c '%U:%G %a' "$f"), want root:rate-ctl 640 (it may hold a password or a token)"
done
for u in /lib/systemd/system/rate-ctl-agent.service /lib/systemd/system/rate-ctl-serve.service; do
    if grep -E '^ExecStart=.*(RATE_CTL_STORE|RATE_CTL_TOKEN|--store|--token)' "$u"; then
        fail "$u puts the store or the token on the command line"
    fi
done
ok "/etc/default/rate-ctl-{agent,serve} root:rate-ctl 0640; no store or token on the units' command lines"
[ -L /etc/systemd/system/multi-user.target.wants/rate-ctl-agent.service ] || fail "the agent unit is not enabled"
[ ! -e /etc/systemd/system/multi-user.target.wants/rate-ctl-serve.service ] || fail "the serve unit is enabled"
ok "rate-ctl-agent.service enabled, rate-ctl-serve.service not (systemd not running here: nothing started)"

units=(/lib/systemd/system/rate-ctl-agent.service /lib/systemd/system/rate-ctl-serve.service)
set +e
systemd-analyze verify "${units[@]}" >"$tmp/verify.txt" 2>&1
verify_rc=$?
set -e
cat "$tmp/verify.txt"
((verify_rc == 0)) || fail "systemd-analyze verify exit $verify_rc"
if grep -q 'rate-ctl' "$tmp/verify.txt"; then fail "systemd-analyze verify complains about our units"; fi
ok "systemd-analyze verify: both units clean"
for u in "${units[@]}"; do
    systemd-analyze security --offline=yes "$u" 2>/dev/null | grep 'Overall exposure' || true
done

# ---------------------------------------------------------------------------
say "5. the units' ExecStart lines with the packaged defaults; nginx as www-data"
# What systemd would run: the unit's User=, Group=, the user's groups plus
# SupplementaryGroups=, UMask=, NoNewPrivileges=, only the EnvironmentFile's
# variables, and ExecStart with systemd's expansion ("$VAR" alone splits the
# value into words, "${VAR}" is one word). RuntimeDirectory=D as systemd
# makes it: /run/D with RuntimeDirectoryMode=, owned by User:Group (the
# whole tree given back to them when the directory is not theirs: systemd's
# path_chown_recursive), then the ExecStartPre= lines, in order, as the
# unit's user (no "+" privileged lines here). The namespace hardening
# (ProtectSystem=, PrivateTmp=, ...) needs systemd as PID 1: checked above
# with systemd-analyze only. Overrides (VAR=VALUE) replace file values.
unit_key() { sed -n "s/^$2=//p" "$1" | tail -n1; }
start_unit() { # UNIT LOG [VAR=VALUE...]
    local unit="/lib/systemd/system/$1.service" log="$2"
    shift 2
    local user group supp umask envfile exec rtdir rtmode
    user="$(unit_key "$unit" User)"
    group="$(unit_key "$unit" Group)"
    supp="$(unit_key "$unit" SupplementaryGroups)"
    umask="$(unit_key "$unit" UMask)"
    envfile="$(unit_key "$unit" EnvironmentFile)"
    exec="$(unit_key "$unit" ExecStart)"
    [ "$(unit_key "$unit" NoNewPrivileges)" = yes ] || fail "$1: NoNewPrivileges"
    local -A vars=()
    local line k v
    while IFS= read -r line; do
        [[ "$line" =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
        k="${BASH_REMATCH[1]}" v="${BASH_REMATCH[2]}"
        if [[ "$v" =~ ^\"(.*)\"$ ]]; then v="${BASH_REMATCH[1]}"; fi
        vars[$k]="$v"
    done <"$envfile"
    for line in "$@"; do vars[${line%%=*}]="${line#*=}"; done
    local args=()
    expand() { # COMMAND-LINE: into args, with the unit's vars
        local words w parts
        args=()
        read -ra words <<<"$1"
        for w in "${words[@]}"; do
            if [[ "$w" =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
                read -ra parts <<<"${vars[${BASH_REMATCH[1]}]:-}"
                args+=("${parts[@]}")
            else
                while [[ "$w" =~ \$\{([A-Za-z_][A-Za-z0-9_]*)\} ]]; do
                    w="${w//"${BASH_REMATCH[0]}"/"${vars[${BASH_REMATCH[1]}]:-}"}"
                done
                args+=("$w")
            fi
        done
    }
    local envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        "HOME=$(getent passwd "$user" | cut -d: -f6)" "USER=$user" "LOGNAME=$user")
    for k in "${!vars[@]}"; do envs+=("$k=${vars[$k]}"); done
    local groups
    groups="$( (id -Gn "$user" | tr ' ' '\n'; tr ' ' '\n' <<<"$supp") | grep . | sort -u | paste -sd,)"
    rtdir="$(unit_key "$unit" RuntimeDirectory)"
    if [ -n "$rtdir" ]; then
        rtmode="$(unit_key "$unit" RuntimeDirectoryMode)"
        if [ -d "/run/$rtdir" ]; then
            chmod "${rtmode:-0755}" "/run/$rtdir"
            [ "$(stat -c %U:%G "/run/$rtdir")" = "$user:$group" ] || chown -R "$user:$group" "/run/$rtdir"
        else
            install -d -o "$user" -g "$group" -m "${rtmode:-0755}" "/run/$rtdir"
        fi
    fi
    local pre
    while IFS= read -r pre; do
        [[ "$pre" != [+!@:-]* ]] || fail "$1: ExecStartPre=$pre: prefix not emulated here"
        expand "$pre"
        echo "  as $user ($groups), umask $umask: ExecStartPre ${args[*]}"
        (
            umask "$umask"
            exec setpriv --reuid="$user" --regid="$group" --groups="$groups" --no-new-privs -- \
                env -i "${envs[@]}" "${args[@]}"
        ) >>"$log" 2>&1 || fail "$1: ExecStartPre=$pre failed: $(tail -n 3 "$log")"
    done < <(sed -n 's/^ExecStartPre=//p' "$unit")
    expand "$exec"
    echo "  as $user ($groups), umask $umask: ${args[*]}"
    (
        umask "$umask"
        exec setpriv --reuid="$user" --regid="$group" --groups="$groups" --no-new-privs -- \
            env -i "${envs[@]}" "${args[@]}"
    ) >"$log" 2>&1 &
    pids+=($!)
    started_pid=$!
}
wait_for() { # SECONDS DESCRIPTION COMMAND...
    local until=$((SECONDS + $1)) what="$2"
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < until)) || fail "timed out waiting for $what"
        sleep 0.1
    done
}

# serve: packaged defaults, but any free port instead of 9090.
start_unit rate-ctl-serve "$tmp/serve.log" RATE_CTL_LISTEN=127.0.0.1:0
serve_pid=$started_pid
wait_for 30 "rate-ctl serve to listen" grep -q 'listening on http://' "$tmp/serve.log"
api="$(sed -n 's/.*listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$tmp/serve.log" | head -n1)"
ok "serve listens on $api; store and token: $(find /var/lib/rate-ctl -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | paste -sd' ')"
[ "$(stat -c '%U %a' /var/lib/rate-ctl/admin.token)" = "rate-ctl 600" ] || fail "admin.token owner/mode"
# What `ps` shows of it: not the store (it came from the environment file).
if tr '\0' ' ' <"/proc/$serve_pid/cmdline" | grep -q 'sqlite:'; then
    fail "serve's command line shows the store: $(tr '\0' ' ' <"/proc/$serve_pid/cmdline")"
fi

# agent: exactly the packaged defaults.
start_unit rate-ctl-agent "$tmp/agent.log"
agent_pid=$started_pid
table=/run/rate-ctl/rate_ctl
# The directory: the agent's alone, nginx's workers (www-data) traverse it.
# The configuration without group write (the workers only read it), the
# state file (counters) writable by the workers' group.
check_files() {
    wait_for 30 "the agent's table $table" test -f "$table.state"
    local f want
    for f in /run/rate-ctl:750 "$table:640" "$table.state:660"; do
        want="rate-ctl:www-data ${f##*:}"
        [ "$(stat -c '%U:%G %a' "${f%:*}")" = "$want" ] ||
            fail "${f%:*} is $(stat -c '%U:%G %a' "${f%:*}"), want $want"
    done
}
check_files
if setpriv --reuid=www-data --regid=www-data --init-groups -- touch /run/rate-ctl/planted 2>/dev/null; then
    fail "www-data could create a file in /run/rate-ctl"
fi
ok "agent wrote $table rate-ctl:www-data 0640 and $table.state 0660 in /run/rate-ctl rate-ctl:www-data 0750 (www-data cannot create files there)"
if tr '\0' ' ' <"/proc/$agent_pid/cmdline" | grep -q 'sqlite:'; then
    fail "the agent's command line shows the store: $(tr '\0' ' ' <"/proc/$agent_pid/cmdline")"
fi
ok "neither serve's nor the agent's command line shows the store (RATE_CTL_STORE from the environment file)"

# nginx: Debian's binary as www-data, loading the module through the
# package's modules-enabled link, as /etc/nginx/nginx.conf does.
port=""
for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    if [ -z "$(ss -Htln "sport = :$p")" ]; then
        port=$p
        break
    fi
done
[ -n "$port" ] || fail "no free port"
ng="$tmp/nginx"
mkdir -p "$ng/logs"
cat >"$ng/nginx.conf" <<EOF
include /etc/nginx/modules-enabled/*.conf;
worker_processes 2;
pid $ng/nginx.pid;
error_log $ng/logs/error.log notice;
events { worker_connections 64; }
http {
    access_log $ng/logs/access.log;
    client_body_temp_path $ng/body;
    proxy_temp_path $ng/proxy;
    fastcgi_temp_path $ng/fastcgi;
    uwsgi_temp_path $ng/uwsgi;
    scgi_temp_path $ng/scgi;
    server {
        listen 127.0.0.1:$port;
        location /limited { rate_ctl on; empty_gif; }
        location = /rate_ctl/stats { rate_ctl_stats; }
    }
}
EOF
chown -R www-data:www-data "$ng"
setpriv --reuid=www-data --regid=www-data --init-groups -- /usr/sbin/nginx -c "$ng/nginx.conf" \
    -g 'daemon off;' >"$ng/logs/stderr.log" 2>&1 &
pids+=($!)
nginx_pid=$!
code() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$1"; }
stats_up() { [ "$(code /rate_ctl/stats)" = 200 ]; }
wait_for 20 "nginx on 127.0.0.1:$port" stats_up
ok "/usr/sbin/nginx as www-data on 127.0.0.1:$port with the packaged module"

token="$(cat /var/lib/rate-ctl/admin.token)"
id="$(rate-ctl --api "$api" --token "$token" strategy add --name package-test --match api=/limited \
    --algorithm token_bucket --rate 1 --per minute --burst 3 --scope host)"
[[ "$id" =~ ^[0-9]+$ ]] || fail "strategy add printed '$id'"
runuser -u rate-ctl -- rate-ctl strategy list | tee "$tmp/list.txt"
grep -q package-test "$tmp/list.txt" || fail "the CLI on the packaged default store does not list the strategy"
ok "strategy $id added through serve's API; listed by 'runuser -u rate-ctl -- rate-ctl strategy list'"
in_table() { rate-ctl shm inspect --json "$table" | grep -q '"strategies": \[$'; }
wait_for 10 "the agent to publish strategy $id" in_table

codes=()
for _ in $(seq 10); do codes+=("$(code /limited)"); done
echo "  10 requests to /limited: ${codes[*]}"
n200=0 n503=0
for c in "${codes[@]}"; do
    case "$c" in 200) n200=$((n200 + 1)) ;; 503) n503=$((n503 + 1)) ;; esac
done
((n200 == 3 && n503 == 7)) || fail "expected 3 × 200 (burst 3) then 7 × 503, got ${codes[*]}"
read -r passed limited < <(rate-ctl shm inspect --json "$table" |
    awk -F': ' '/"passed"/ {gsub(/,/, "", $2); p=$2} /"limited"/ {gsub(/,/, "", $2); l=$2} END {print p, l}')
((passed == 3 && limited == 7)) || fail "the table counts passed=$passed limited=$limited, want 3 and 7"
ok "enforced by the packaged module: 3 passed, 7 × 503; the table counts passed=$passed limited=$limited"


# Fleet metrics: the agent reports the module's counters to the store, serve
# exposes them; every series the packaged dashboard queries exists in serve's
# /metrics or in the module's Prometheus stats.
fleet_has() {
    curl -sf -H "Authorization: Bearer $token" "$api/metrics" >"$tmp/metrics.txt" &&
        grep -qx "rate_ctl_fleet_passed_total{strategy=\"$id\",name=\"package-test\",host=\"[^\"]*\"} 3" "$tmp/metrics.txt" &&
        grep -qx "rate_ctl_fleet_limited_total{strategy=\"$id\",name=\"package-test\",host=\"[^\"]*\"} 7" "$tmp/metrics.txt"
}
wait_for 10 "serve's /metrics to count 3 passed and 7 limited" fleet_has
grep -E '^rate_ctl_(fleet|host)_' "$tmp/metrics.txt" | sed 's/^/  /'
[ "$(curl -s -o /dev/null -w '%{http_code}' "$api/metrics")" = 401 ] || fail "/metrics without a token"
ok "serve's /metrics (token needed): strategy $id passed 3, limited 7 as the agent reported"
curl -sf "http://127.0.0.1:$port/rate_ctl/stats?format=prometheus" >"$tmp/module-metrics.txt"
dash=/usr/share/rate-ctl/grafana-dashboard.json
names="$(grep -o '"expr": "[^"]*"' "$dash" | grep -o 'rate_ctl_[a-z_]*' | sort -u)"
[ "$(wc -w <<<"$names")" -ge 10 ] || fail "$dash names only: $names"
for n in $names; do
    grep -qE "^$n(\{| )" "$tmp/metrics.txt" "$tmp/module-metrics.txt" ||
        fail "the dashboard queries $n: no such series in serve's /metrics or the module's stats"
done
ok "every series the packaged dashboard queries exists ($(wc -w <<<"$names") names)"

# A restart of the agent keeps the table (RuntimeDirectoryPreserve=yes):
# the directory and the files keep their owners and modes (systemd gave the
# tree back to rate-ctl:rate-ctl, the unit's ExecStartPre gives it to
# www-data again), the counters are still there and the limit holds.
kill "$agent_pid"
set +e
wait "$agent_pid"
rc=$?
set -e
((rc == 0)) || fail "the agent exited $rc on SIGTERM (want 0)"
start_unit rate-ctl-agent "$tmp/agent2.log"
agent_pid=$started_pid
check_files
wait_for 10 "the restarted agent to publish" grep -q published "$tmp/agent2.log"
[ "$(code /limited)" = 503 ] || fail "after the agent's restart, /limited is not limited"
read -r passed limited < <(rate-ctl shm inspect --json "$table" |
    awk -F': ' '/"passed"/ {gsub(/,/, "", $2); p=$2} /"limited"/ {gsub(/,/, "", $2); l=$2} END {print p, l}')
((passed == 3 && limited == 8)) || fail "after the agent's restart the table counts passed=$passed limited=$limited, want 3 and 8"
if grep -q 'changed by someone else' "$tmp/agent2.log"; then fail "the restarted agent found its files changed"; fi
ok "agent restarted: same owners and modes, counters kept (passed=$passed limited=$limited), still 503"

kill "$nginx_pid" "$agent_pid" "$serve_pid"
for p in "$agent_pid" "$serve_pid"; do
    set +e
    wait "$p"
    rc=$?
    set -e
    ((rc == 0)) || fail "pid $p exited $rc on SIGTERM (want 0); logs: $(tail -n 5 "$tmp"/agent.log "$tmp"/serve.log)"
done
wait "$nginx_pid" 2>/dev/null || true
pids=()
if grep -E '\[(alert|crit|emerg)\]' "$ng/logs/error.log"; then fail "nginx logged alerts"; fi
ok "agent and serve exit 0 on SIGTERM"

# ---------------------------------------------------------------------------
say "6. an nginx upgrade to another ABI would take the module out"
apt-get -s "${apt_opts[@]}" install "$tmp/nginx-other-abi.deb" >"$tmp/apt-upgrade.txt" 2>&1 || true
grep -q '^Remv libnginx-mod-http-rate-ctl ' "$tmp/apt-upgrade.txt" ||
    {
        cat "$tmp/apt-upgrade.txt"
        fail "apt would keep the module next to an nginx with another ABI"
    }
ok "apt-get -s install of an nginx providing nginx-abi-0.0.0-0 removes libnginx-mod-http-rate-ctl"

# ---------------------------------------------------------------------------
say "7. dpkg --purge both"
dpkg --purge "${pkgs[@]}" 2>&1 | tee "$tmp/purge.txt"
installed=false
grep -q 'could not remove' "$tmp/purge.txt" && fail "postrm could not remove something"
if [ -e "$link" ] || [ -L "$link" ] || [ -L "$link.removed" ]; then fail "module link left"; fi
getent passwd rate-ctl >/dev/null && fail "user rate-ctl left"
getent group rate-ctl >/dev/null && fail "group rate-ctl left"
id -nG www-data >/dev/null
[ ! -e /var/lib/rate-ctl ] || fail "/var/lib/rate-ctl left"
[ ! -e /run/rate-ctl ] || fail "/run/rate-ctl left"
[ ! -e /usr/bin/rate-ctl ] || fail "/usr/bin/rate-ctl left"
/usr/sbin/nginx -t 2>&1 | tee "$tmp/nginx-t2.txt"
grep -q 'test is successful' "$tmp/nginx-t2.txt" || fail "nginx -t after purge"
ok "link, user, group, store, /run/rate-ctl (table) and binary gone; nginx -t passes"
snapshot >"$tmp/after"
diff -u "$tmp/before" "$tmp/after" || fail "the purge left the machine different from before the test"
ok "the files and users the packages touch are as before the test"

echo
echo "package-test: all passed in $((SECONDS - t0)) s (first package build $first_build s)"
