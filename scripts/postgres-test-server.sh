#!/usr/bin/env bash
# A throw-away PostgreSQL server for the store and serve tests.
#
#   scripts/postgres-test-server.sh start [DIR]   # prints the postgres:// URL on stdout
#   scripts/postgres-test-server.sh stop  [DIR]   # stops the server started in DIR (by PID)
#   scripts/postgres-test-server.sh url   [DIR]   # prints the URL of a running server
#
# DIR defaults to $POSTGRES_TEST_DIR or /tmp/rate-ctl-postgres. The server
# runs Debian's postgres binary as the user `postgres` (it refuses root) with
# its own data directory and socket under DIR, listens on 127.0.0.1 only
# (port $POSTGRES_TEST_PORT, else the first free port from 54320), and has a
# database `rate_ctl` owned by the user `rate_ctl` / password `rate_ctl`, who
# may create databases (the tests make one each). Debian's `postgresql`
# package is installed with apt-get if missing; its own cluster is not started.
set -euo pipefail
# shellcheck source=scripts/lib/test-server.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/test-server.sh"

dir=${2:-${POSTGRES_TEST_DIR:-/tmp/rate-ctl-postgres}}

bindir() {
    local d
    d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n1)
    [ -n "$d" ] && [ -x "$d/postgres" ] && echo "$d"
}

install_server() {
    bindir >/dev/null && return 0
    install_without_service postgres-test-server postgresql
}

# As the user postgres, exec'ing (no parent left behind: the PID is the server's).
as_pg() {
    if [ "$(id -un)" = postgres ]; then "$@"; else setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; fi
}

start() {
    install_server
    local bin
    bin=$(bindir)
    mkdir -p "$dir"
    chmod 0755 "$dir"
    local fresh=0
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        fresh=1
        rm -rf "$dir/data" "$dir/sock"
        install -d -o postgres -g postgres -m 0700 "$dir/data"
        as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
            >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    install -d -o postgres -g postgres -m 0755 "$dir/sock"
    local port
    port=$(server_port "${POSTGRES_TEST_PORT:-54320}")
    touch "$dir/server.log"
    chown postgres "$dir/server.log"
    # setsid: the server must not die with the shell or test that started it.
    # fsync off: a test server, thrown away.
    setsid setpriv --reuid=postgres --regid=postgres --init-groups -- "$bin/postgres" -D "$dir/data" -h 127.0.0.1 -p "$port" \
        -k "$dir/sock" -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        -c max_connections=300 -c shared_buffers=32MB \
        </dev/null >>"$dir/server.log" 2>&1 &
    echo $! >"$dir/pid"
    server_wait "$dir/server.log" as_pg "$bin/pg_isready" -q -h "$dir/sock" -p "$port"
    if [ "$fresh" = 1 ]; then
        as_pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$port" -U postgres -d postgres <<'SQL'
CREATE ROLE rate_ctl LOGIN PASSWORD 'rate_ctl' CREATEDB;
CREATE DATABASE rate_ctl OWNER rate_ctl ENCODING 'UTF8';
SQL
    fi
    server_ready "postgres://rate_ctl:rate_ctl@127.0.0.1:$port/rate_ctl" "$port"
}

# SIGINT: PostgreSQL's fast shutdown.
server_main "${1:-}" INT
