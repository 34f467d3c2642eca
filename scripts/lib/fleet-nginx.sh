# shellcheck shell=bash
# Sourced by scripts/fleet-split.sh for --nginx: the one-machine fleet test
# of issue 17 through real nginx. One `rate-ctl serve` on SQLite, three
# vendored nginx instances on free loopback ports, each with its own shm
# file and its own agent (host ids h0 h1 h2) through that serve; a cluster
# token bucket of 300/s (burst 20, split: demand) on /fleet; a Perl load
# generator per instance over one keep-alive connection (HTTP::Tiny)
# offering 80/15/5 of 1.0× then 2.0× for PHASE seconds each and counting
# the 200s per second. Prints one "1.0x …"/"2.0x …" line per phase in the
# form tests/fleet_leases.rs prints, for fleet-split.sh's table.
#   fleet_nginx_run       env: PHASE=25; uses target/modules/vendored
# Every process it starts is stopped by its PID on exit.

# shellcheck source=scripts/lib/bench-nginx.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-nginx.sh"

fleet_pids=()
fleet_stop() {
    local p
    for p in "${fleet_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${fleet_pids[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    fleet_pids=()
    [ -n "${fleet_dir:-}" ] && rm -rf "$fleet_dir"
}

fleet_free_port() {
    local port=$((20000 + RANDOM % 20000))
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    echo "$port"
}

# fleet_gen PORT RATE SECONDS: requests /fleet at RATE/s for SECONDS over one
# keep-alive connection; prints "EPOCH_SECOND ADMITTED SENT" per whole second.
fleet_gen() {
    perl -MHTTP::Tiny -MTime::HiRes=time,sleep -e '
        my ($port, $rate, $secs) = @ARGV;
        my $http = HTTP::Tiny->new(keep_alive => 1, timeout => 5);
        my $url = "http://127.0.0.1:$port/fleet";
        my ($start, $last, $due, %ok, %sent) = (time) x 2;
        $due = 0;
        while ((my $now = time) < $start + $secs) {
            $due += $rate * ($now - $last);
            $last = $now;
            while ($due >= 1) {
                $due -= 1;
                my $r = $http->get($url);
                my $t = int(time);
                $ok{$t} += $r->{status} == 200 ? 1 : 0;
                $sent{$t}++;
            }
            sleep 0.002;
        }
        my @s = sort { $a <=> $b } keys %ok;
        shift @s; pop @s;    # partial first and last seconds
        print "$_ $ok{$_} $sent{$_}\n" for @s;
    ' "$1" "$2" "$3"
}

fleet_nginx_run() {
    local phase="${PHASE:-25}" root="$PWD" bin="$PWD/target/debug/rate-ctl"
    # The benchmarks' setup: module, nginx and a scratch directory (the
    # module is built only when there is none yet).
    local SKIP_BUILD=${SKIP_BUILD:-}
    [ -f "$root/target/modules/vendored/ngx_http_rate_ctl_module.so" ] && SKIP_BUILD=1
    bench_setup vendored fleet || return 1
    [ -x "$bin" ] || cargo build -q --bin rate-ctl || return 1
    fleet_dir=$dir
    local d=$fleet_dir
    trap fleet_stop EXIT
    trap 'exit 130' INT TERM
    NO_COLOR=1 "$bin" serve --store "sqlite:$d/rate-ctl.db" --listen 127.0.0.1:0 \
        --admin-token-file "$d/admin.token" --freshness 3s >"$d/serve.out" 2>"$d/serve.log" &
    fleet_pids+=($!)
    local addr="" _
    for _ in $(seq 1 100); do
        addr="$(sed -n 's,^listening on http://,,p' "$d/serve.out")"
        [ -n "$addr" ] && break
        sleep 0.1
    done
    [ -n "$addr" ] || { cat "$d/serve.log" >&2; return 1; }
    local token
    token="$(cat "$d/admin.token")"
    curl -sf -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
        -d '{"name":"fleet","algorithm":"token_bucket","rate":300,"burst":20,"match":{"api":"/fleet"},"split":"demand"}' \
        "http://$addr/api/v1/strategies" >/dev/null || { echo "fleet-nginx: creating the strategy failed" >&2; return 1; }
    local ports=() h
    for h in 0 1 2; do
        mkdir -p "$d/h$h/logs"
        NO_COLOR=1 "$bin" agent --store "http://$addr" --token "$token" --shm "$d/h$h/shm" \
            --host-id "h$h" --log-level info --max-strategies 1024 --segment-bytes 262144 \
            --blacklist-entries 256 --freshness 3s --max-backoff-ms 500 2>"$d/h$h/agent.log" &
        fleet_pids+=($!)
    done
    for h in 0 1 2; do
        for _ in $(seq 1 100); do [ -s "$d/h$h/shm" ] && break; sleep 0.1; done
        ports+=("$(fleet_free_port)")
        {
            dir="$d/h$h" conf_head 1 warn
            cat <<CONF
http {
    access_log off;
    rate_ctl_shm $d/h$h/shm;
    server {
        listen 127.0.0.1:${ports[$h]};
        location /fleet { rate_ctl on; empty_gif; }
        location /stats { rate_ctl_stats; }
    }
}
CONF
        } >"$d/h$h/nginx.conf"
        "$nginx" -p "$d/h$h/" -c "$d/h$h/nginx.conf" -e "$d/h$h/logs/error.log" &
        fleet_pids+=($!)
    done
    for h in 0 1 2; do
        for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:${ports[$h]}/stats" && break; sleep 0.1; done
        curl -sf -o /dev/null "http://127.0.0.1:${ports[$h]}/stats" ||
            { echo "fleet-nginx: nginx h$h did not start" >&2; cat "$d/h$h/logs/error.log" "$d/h$h/agent.log" >&2; return 1; }
    done
    local factor total
    for factor in 1.0 2.0; do
        total=$(awk -v f="$factor" 'BEGIN { print 300 * f }')
        local gens=() share=(80 15 5)
        for h in 0 1 2; do
            fleet_gen "${ports[$h]}" $((total * share[h] / 100)) "$phase" >"$d/gen$h" &
            gens+=($!)
        done
        wait "${gens[@]}"
        for h in 0 1 2; do sed "s/\$/ $h/" "$d/gen$h"; done | sort -n |
            awk -v f="$factor" '
                $1 != last { N++; last = $1 }
                { v[N] += $2; o[N] += $3; hv[N, $4] = $2 }
                END {
                    c = -1
                    for (i = 1; i + 2 <= N; i++)
                        if (v[i] >= 285 && v[i] <= 315 && v[i+1] >= 285 && v[i+1] <= 315 && v[i+2] >= 285 && v[i+2] <= 315) { c = i; break }
                    if (c < 0 || c + 12 > N) { printf "%sx: not converged in %d s\n", f, N; exit 1 }
                    s = 0; m = 0; off = 0
                    for (i = c + 3; i < c + 13; i++) {
                        s += v[i]; off += o[i]; if (v[i] > m) m = v[i]
                        for (h = 0; h < 3; h++) ph[h] += hv[i, h]
                    }
                    printf "%sx: converged in %d s, %.1f %% of the rate over 10 s, max second %d (real nginx; offered %.0f/s, admitted per host %.1f/%.1f/%.1f per s)\n", f, c, s / 30, m, off / 10, ph[0] / 10, ph[1] / 10, ph[2] / 10
                }' || return 1
    done
    if grep -h -E '\[(alert|crit|emerg)\]' "$d"/h?/logs/error.log >&2; then return 1; fi
}
