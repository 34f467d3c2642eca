#!/usr/bin/env bash
# A throw-away MariaDB server for the store and agent tests.
#
#   scripts/mariadb-test-server.sh start [DIR]   # prints the mysql:// URL on stdout
#   scripts/mariadb-test-server.sh stop  [DIR]   # stops the server started in DIR (by PID)
#   scripts/mariadb-test-server.sh url   [DIR]   # prints the URL of a running server
#
# DIR defaults to $MARIADB_TEST_DIR or /tmp/rate-ctl-mariadb. The server runs as
# a background process with its own --datadir under DIR, listens on 127.0.0.1
# only (port $MARIADB_TEST_PORT, else the first free port from 33060), and has a
# database `rate_ctl` with user `rate_ctl` / password `rate_ctl`. `start` on a
# DIR that already has data reuses it (the agent outage test stops and restarts
# one server). Debian's `mariadb-server` is installed with apt-get if missing;
# the package's own service is not started.
set -euo pipefail
# shellcheck source=scripts/lib/test-server.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/test-server.sh"

dir=${2:-${MARIADB_TEST_DIR:-/tmp/rate-ctl-mariadb}}

find_bin() {
    for b in mariadbd mysqld; do
        for p in "/usr/sbin/$b" "$(command -v "$b" 2>/dev/null || true)"; do
            [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
        done
    done
    return 1
}

install_server() {
    if find_bin >/dev/null && command -v mariadb-install-db >/dev/null; then
        return 0
    fi
    log "installing mariadb-server with apt-get"
    install_without_service mariadb-test-server mariadb-server mariadb-client
}

# shellcheck disable=SC2120 # (server_wait passes its arguments)
client() {
    local c
    c=$(command -v mariadb || command -v mysql)
    "$c" --no-defaults --protocol=socket --socket="$dir/mysqld.sock" -uroot "$@"
}

start() {
    export DEBIAN_FRONTEND=noninteractive
    install_server
    local bin
    bin=$(find_bin)
    mkdir -p "$dir"
    local fresh=0
    if [ ! -d "$dir/data/mysql" ]; then
        fresh=1
        rm -rf "$dir/data"
        mkdir -p "$dir/data"
        mariadb-install-db --no-defaults --user="$(id -un)" --datadir="$dir/data" \
            --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 ||
            { cat "$dir/install.log" >&2; exit 1; }
    fi
    local port
    port=$(server_port "${MARIADB_TEST_PORT:-33060}")
    # setsid: the server must not die with the shell or test that started it.
    setsid "$bin" --no-defaults --user="$(id -un)" --datadir="$dir/data" \
        --bind-address=127.0.0.1 --port="$port" --socket="$dir/mysqld.sock" \
        --pid-file="$dir/mysqld.pid" --log-error="$dir/error.log" \
        --skip-name-resolve --innodb-buffer-pool-size=64M --innodb-log-file-size=48M \
        --max-connections=500 --innodb-flush-log-at-trx-commit=2 \
        </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/pid"
    server_wait "$dir/error.log" client -e 'SELECT 1'
    if [ "$fresh" = 1 ]; then
        client <<'SQL'
CREATE DATABASE IF NOT EXISTS rate_ctl CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER IF NOT EXISTS 'rate_ctl'@'127.0.0.1' IDENTIFIED BY 'rate_ctl';
CREATE USER IF NOT EXISTS 'rate_ctl'@'localhost' IDENTIFIED BY 'rate_ctl';
GRANT ALL PRIVILEGES ON rate_ctl.* TO 'rate_ctl'@'127.0.0.1';
GRANT ALL PRIVILEGES ON rate_ctl.* TO 'rate_ctl'@'localhost';
-- Tests create and drop their own databases named rate_ctl_t<pid>_<n>.
GRANT ALL PRIVILEGES ON `rate\_ctl\_t%`.* TO 'rate_ctl'@'127.0.0.1';
GRANT ALL PRIVILEGES ON `rate\_ctl\_t%`.* TO 'rate_ctl'@'localhost';
FLUSH PRIVILEGES;
SQL
    fi
    server_ready "mysql://rate_ctl:rate_ctl@127.0.0.1:$port/rate_ctl" "$port"
}

server_main "${1:-}" TERM
