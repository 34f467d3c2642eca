# shellcheck shell=bash disable=SC2154
# (SC2154: `dir` is set by the sourcing script.)
# Sourced by scripts/mariadb-test-server.sh and scripts/postgres-test-server.sh:
# what a throw-away database server for the tests does the same whatever the
# database. The sourcing script sets `dir` (the server's directory) and
# defines `start`; then it calls `server_main "$1" SIGNAL`.

# shellcheck source=scripts/lib/packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/packages.sh"

# Installs Debian packages without letting their init scripts start a
# system-wide server (a policy-rc.d that says no, removed again if ours).
#   install_without_service WHO PKG...
install_without_service() {
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
    fi
    local rc=0
    need_packages "$@" || rc=$?
    [ "$created_policy" = 1 ] && rm -f "$policy"
    return $rc
}

# Messages on stderr, prefixed with the script's name.
log() { echo "$(basename "$0" .sh): $*" >&2; }

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

running() {
    [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null
}

# The server's port: the one it had in $dir, else the first free one from
# the given start (kept in $dir/port, so a restarted server keeps its URL).
server_port() {
    local port
    if [ -f "$dir/port" ]; then
        port=$(cat "$dir/port")
    else
        port=$1
        while ! port_free "$port"; do port=$((port + 1)); done
        echo "$port" >"$dir/port"
    fi
    echo "$port"
}

# Waits up to 30 s for READY_CMD to succeed while the server runs; if the
# server exits first, shows the end of its LOG and fails. Then runs
# READY_CMD once more, so that a server still not ready fails the script.
#   server_wait LOG READY_CMD...
server_wait() {
    local log_file=$1 _
    shift
    for _ in $(seq 1 300); do
        if "$@" >/dev/null 2>&1; then break; fi
        if ! running; then
            log "server exited; see $log_file"
            tail -20 "$log_file" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    "$@" >/dev/null
}

# Records the URL of the server now running on PORT in $dir/url, says so
# and prints the URL (what `start` prints on stdout).
#   server_ready URL PORT
server_ready() {
    echo "$1" >"$dir/url"
    log "running as PID $(cat "$dir/pid") on 127.0.0.1:$2 (data in $dir/data)"
    cat "$dir/url"
}

# Stops the server started in $dir by its PID with the given signal, then
# SIGKILL after 30 s.
server_stop() {
    if ! running; then
        rm -f "$dir/pid"
        return 0
    fi
    local pid _
    pid=$(cat "$dir/pid")
    kill "-$1" "$pid"
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "PID $pid did not stop in 30 s; killing it"
        kill -KILL "$pid" || true
    fi
    rm -f "$dir/pid"
    log "stopped PID $pid"
}

# start | stop SIGNAL | url, as the scripts' usage lines say.
server_main() {
    case "$1" in
    start)
        # A server already running in $dir: its URL.
        if running; then
            cat "$dir/url"
        else
            start
        fi
        ;;
    stop) server_stop "$2" ;;
    url) running && cat "$dir/url" ;;
    *)
        echo "usage: $0 start|stop|url [DIR]" >&2
        exit 2
        ;;
    esac
}
