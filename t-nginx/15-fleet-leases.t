# Fleet leases (issue 17) through real nginx: one `rate-ctl serve` over HTTPS
# (issue 34: a test CA made with openssl here, agents verify it with --ca; SQLite,
# or a fresh database on the MariaDB server of RATE_CTL_TEST_MYSQL_URL when
# it is set), three nginx instances with distinct host ids (h0 h1 h2), each
# with its own shm file and its own agent through that serve; a cluster
# token bucket of 300/s (burst 20, split: demand) and a per-day quota of 100
# (split: demand). One Perl load generator per instance over a keep-alive
# connection, counting the 200s per second (whole seconds of the clock).
#
# The nginx builds share one fleet, as in a rolling upgrade: h0 and h3 run
# the first target of RATE_CTL_TARGETS, h1 and h2 the second (with both
# builds: h0 = vendored 1.28 carries the traffic before the flip, h2 =
# Debian 1.22 after it); with one target every host runs it.
#
# Phases of FLEET_PHASE seconds (default 16):
#   1.0×, 2.0× (80/15/5 of 300/s), then flipped to 5/15/80: after
#     convergence (3 s in a row within ±5 %) the 10 s average is ≥ 95 % and
#     ≤ 102 % of the rate, no second above 105 %; the flip converges in ≤ 6 s
#   serve killed for FLEET_OUTAGE s (default 11: the 5 s lease expiry and
#     then the static split for a few seconds; the issue's 30 s adds only
#     wall time): no second above 105 %, after the expiry every host at
#     least 90 % of its static share (30/90/100 of 30/90/480 offered)
#   serve back on the same address: within ±5 % again within 10 s
#   a fourth host h3 joins (150/s) as h0 dies (agent killed, nginx stopped,
#     its traffic gone): 3 s in a row within ±5 % with h3 at ≥ 90/s within
#     FLEET_JOIN − 3 s (default 20), no second above 105 % after the first
#     two (h3 enforces its static share, 75/s, until its first lease)
#   the per-day quota, 20/s offered to h0 alone until serve is killed:
#     exactly 100 admitted (the static split would admit 34)
# About 100 s. Figures are printed with note() (prove -v, or run with perl)
# in the form scripts/fleet-split.sh --nginx reads for the README table.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Select;
use IO::Socket::IP;
use JSON::PP qw(decode_json);
use POSIX qw(ceil floor);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $RATE   = 300;
my $PHASE  = $ENV{FLEET_PHASE}  // 16;
my $OUTAGE = $ENV{FLEET_OUTAGE} // 11;
my $JOIN   = $ENV{FLEET_JOIN}   // 20;
my $BACK   = 10;
my $bin    = rate_ctl_bin();
my @targets = targets();
my @access = agent_access();
my $main = workers_main();
my %build = (h0 => $targets[0], h1 => $targets[-1], h2 => $targets[-1], h3 => $targets[0]);

# The processes of this test (serve, agents, nginx, load generators) at a
# higher priority where allowed (root): on a machine busy with builds a
# generator or worker that waits 200 ms for a CPU loses that much of its
# host's lease (the bucket holds 20 × lease / 300 tokens), which measures
# the machine, not the split. No effect without the privilege.
POSIX::nice(-5) if $> == 0;
my $dir = tempdir('rate_ctl_fleet_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
chmod 0755, $dir;
# Every process started here is stopped at exit (RateCtlTest's spawn).
$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

# The store: a fresh database on the MariaDB server when one is configured.
my ($store, $store_label, $drop) = ("sqlite:$dir/rate-ctl.db", 'SQLite');
if (my $base = $ENV{RATE_CTL_TEST_MYSQL_URL}) {
    my ($user, $pass, $host, $port, $db0) = $base =~ m{^mysql://([^:]+):([^@]*)@([^:/]+):(\d+)/(\w+)$}
        or BAIL_OUT("RATE_CTL_TEST_MYSQL_URL: expected mysql://user:pass\@host:port/db, got $base");
    my $db = "rate_ctl_t$$" . "_fleet";    # the test user may create rate_ctl_t%
    my $client = (grep { -x } map {"/usr/bin/$_"} qw(mariadb mysql))[0] or BAIL_OUT('no mariadb client');
    my @sql = ($client, '--no-defaults', '-h', $host, '-P', $port, "-u$user", "-p$pass", '-e');
    system(@sql, "CREATE DATABASE $db") == 0 or BAIL_OUT("CREATE DATABASE $db failed");
    $drop = sub { system(@sql, "DROP DATABASE IF EXISTS $db") };
    ($store, $store_label) = ("mysql://$user:$pass\@$host:$port/$db", 'MariaDB');
}
END { $drop->() if $drop }

# serve speaks HTTPS (issue 34): a CA and a certificate for 127.0.0.1 made
# here with the openssl CLI; the agents verify serve with --ca.
{
    my @ec = ('-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes');
    system('openssl', 'req', '-x509', @ec, '-keyout', "$dir/ca.key", '-out', "$dir/ca.pem", '-days', 2,
        '-subj', '/CN=fleet test CA', '-addext', 'basicConstraints=critical,CA:TRUE',
        '-addext', 'keyUsage=critical,keyCertSign,cRLSign') == 0 or BAIL_OUT('openssl: CA');
    system('openssl', 'req', @ec, '-keyout', "$dir/server.key", '-out', "$dir/server.csr",
        '-subj', '/CN=127.0.0.1') == 0 or BAIL_OUT('openssl: server key');
    open my $fh, '>', "$dir/ext.cnf" or die;
    print $fh "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n";
    close $fh;
    system('openssl', 'x509', '-req', '-in', "$dir/server.csr", '-CA', "$dir/ca.pem", '-CAkey', "$dir/ca.key",
        '-CAcreateserial', '-out', "$dir/server.pem", '-days', 2, '-extfile', "$dir/ext.cnf") == 0
        or BAIL_OUT('openssl: server certificate');
}

# serve, its address (kept across the restart) and its admin token.
sub start_serve {
    my ($listen) = @_;
    my $out = "$dir/serve.out";
    unlink $out;
    spawn('serve', "$dir/serve.log", $bin, 'serve', '--store', $store, '--listen', $listen,
        '--admin-token-file', "$dir/admin.token", '--freshness', '3s',
        '--tls-cert', "$dir/server.pem", '--tls-key', "$dir/server.key");
    # `listening on` goes to stdout, which spawn sends to the log.
    my $addr = wait_until(10, sub { (slurp("$dir/serve.log") =~ /listening on https:\/\/(\S+)\s*$/m)[0] })
        or BAIL_OUT('serve did not start: ' . slurp("$dir/serve.log"));
    return $addr;
}
my $addr  = start_serve('127.0.0.1:0');
my $token = slurp("$dir/admin.token");
chomp $token;
my $http = HTTP::Tiny->new(timeout => 5, verify_SSL => 1, SSL_options => { SSL_ca_file => "$dir/ca.pem" },
    default_headers => { Authorization => "Bearer $token", 'Content-Type' => 'application/json' });
my %id;
for my $s (
    [fleet => '{"name":"fleet","algorithm":"token_bucket","rate":300,"burst":20,"match":{"api":"/fleet"},"split":"demand"}'],
    [daily => '{"name":"daily","algorithm":"fixed_window","rate":100,"per":"day","match":{"api":"/daily"},"split":"demand"}'],
) {
    my $r = $http->post("https://$addr/api/v1/strategies", { content => $s->[1] });
    is($r->{status}, 201, "strategy $s->[0] created") or BAIL_OUT($r->{content});
    $id{ $s->[0] } = decode_json($r->{content})->{id};
}
sub hosts_api { my $r = $http->get("https://$addr/api/v1/hosts"); $r->{success} ? decode_json($r->{content}) : undef }

# A host: its agent through serve, then its nginx on the file the agent made.
my %nginx;
sub start_host {
    my ($h) = @_;
    my $shm = "$dir/$h.shm";
    spawn("agent $h", "$dir/$h.agent.log", $bin, '--ca', "$dir/ca.pem", 'agent', '--store', "https://$addr", '--token', $token,
        '--shm', $shm, '--host-id', $h, '--log-level', 'info', '--max-strategies', 1024,
        '--segment-bytes', 262144, '--blacklist-entries', 256, '--freshness', '3s', '--max-backoff-ms', 500,
        @access);
    wait_until(10, sub { -s $shm }) or BAIL_OUT("agent $h made no file: " . slurp("$dir/$h.agent.log"));
    my $n = RateCtlTest->new($build{$h}, workers => 1, shm => $shm, server => stats_server(), main => $main);
    $n->start;
    $nginx{$h} = $n;
}
start_host($_) for qw(h0 h1 h2);
note "fleet on $store_label: " . join(', ', map {"$_ $build{$_}{name} nginx on port " . $nginx{$_}->port} qw(h0 h1 h2));
# Every host leased both strategies before the load starts.
ok(wait_until(15, sub {
    my $api = hosts_api() or return;
    my @leased = grep { my $h = $_; grep { $_->{strategy} == $id{fleet} } @{ $h->{leases} // [] } } @{ $api->{hosts} };
    @leased == 3;
}), 'the three hosts hold leases') or diag explain hosts_api();

# The load generator: a child requesting PATH on a host at the rate its
# schedule ([from_s, rate], ... from T0) gives, until T0 + END_S; writes
# "second admitted sent" lines to FILE at the end. One keep-alive
# connection, each request written whole and its response read to the end
# of its body: a fraction of HTTP::Tiny's CPU per request, so that the
# 480/s of a busy host are offered on a loaded machine too.
my @gen;    # [host, file] of the /fleet generators
sub generator {
    my ($h, $path, $t0, $end, $file, @schedule) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid) { track("gen $h $path", $pid); return }
    my $port = $nginx{$h}->port;
    my $req  = "GET $path HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    my ($conn, $buf);
    # The status of one request; 0 when the connection failed.
    my $get = sub {
        if (!$conn) {
            $conn = IO::Socket::IP->new(PeerHost => '127.0.0.1', PeerPort => $port, Timeout => 2) or return 0;
            $buf = '';
        }
        if ((syswrite($conn, $req) // 0) != length $req) { undef $conn; return 0 }
        while (1) {
            if ($buf =~ m{^HTTP/1\.1 (\d{3})[^\r\n]*\r\n(.*?)\r\n\r\n}s) {
                my ($status, $head, $at) = ($1, $2, $+[0]);
                my ($len) = $head =~ /^content-length:\s*(\d+)/im;
                if (length($buf) >= $at + ($len // 0)) {
                    substr($buf, 0, $at + ($len // 0), '');
                    undef $conn if $head =~ /^connection:\s*close/im;
                    return $status;
                }
            }
            my $ready = IO::Select->new($conn)->can_read(2);
            if (!$ready || !sysread($conn, $buf, 65536, length $buf)) { undef $conn; return 0 }
        }
    };
    my (%ok, %sent);
    my ($due, $last) = (0, time);
    while ((my $now = time) < $t0 + $end) {
        my $rate = 0;
        for (@schedule) { $rate = $_->[1] if $now >= $t0 + $_->[0] }
        $due += $rate * ($now - $last);
        $last = $now;
        while ($due >= 1) {
            $due -= 1;
            my $status = $get->();
            my $s = floor(time);
            $sent{$s}++;
            $ok{$s} += $status == 200 ? 1 : 0;
        }
        sleep 0.002;
    }
    open my $fh, '>', $file or die "$file: $!";
    print $fh "$_ $ok{$_} $sent{$_}\n" for sort { $a <=> $b } keys %sent;
    close $fh;
    POSIX::_exit(0);
}

# Admitted per second: {second => {host => admitted}}, and offered.
my (%adm, %off, %sent, %first);    # %sent: per second and host; %first: host => its first second with traffic
sub collect {
    for my $g (@gen) {
        my ($h, $file) = @$g;
        for (split /\n/, slurp($file)) {
            my ($s, $ok, $sent) = split;
            $adm{$s}{$h} += $ok;
            $off{$s} += $sent;
            $sent{$s}{$h} += $sent;
            $first{$h} = $s if $sent && (!defined $first{$h} || $s < $first{$h});
        }
    }
}
sub total { my ($s) = @_; my $t = 0; $t += $_ for values %{ $adm{$s} // {} }; $t }
sub within5 { my ($v) = @_; abs($v - $RATE) * 20 <= $RATE }
# converge(FROM, LIMIT, [HOST, MIN]): the first second s in FROM .. FROM+LIMIT
# from which three seconds in a row are within ±5 % of the rate (and HOST
# admits at least MIN in each); s − FROM, or undef.
sub converge {
    my ($from, $limit, $need) = @_;
    for my $s ($from .. $from + $limit) {
        return $s - $from if !grep {
            !within5(total($_)) || ($need && ($adm{$_}{ $need->[0] } // 0) < $need->[1])
        } $s .. $s + 2;
    }
    return undef;
}
sub per_host { my ($s, $n, $h) = @_; my $t = 0; $t += $adm{$_}{$h} // 0 for $s .. $s + $n - 1; $t / $n }
sub seconds { my ($from, $to) = @_; [map { total($_) } $from .. $to - 1] }

# Day boundaries are UTC midnights: start with enough of today left.
window_ahead(86400, 3 * $PHASE + 10);
# T0 on a whole second, so that every phase is whole seconds of the clock.
my $T0 = ceil(time) + 1;
my $T_KILL = $T0 + 3 * $PHASE;
my $T_BACK = $T_KILL + $OUTAGE;
my $T_JOIN = $T_BACK + $BACK;
my $T_END  = $T_JOIN + $JOIN;
my @share = ([80, 15, 5], [80, 15, 5], [5, 15, 80]);
for my $i (0 .. 2) {
    my $h = "h$i";
    my @sched = map { [$_ * $PHASE, $RATE * ($_ ? 2 : 1) * $share[$_][$i] / 100] } 0 .. 2;
    push @sched, [$T_JOIN - $T0, 0] if $i == 0;    # h0 dies: its traffic gone
    push @gen, [$h, "$dir/gen.$h"];
    generator($h, '/fleet', $T0, $T_END - $T0, "$dir/gen.$h", @sched);
}
generator('h0', '/daily', $T0, $T_KILL - $T0, "$dir/gen.daily", [0, 20]);

sub sleep_until { my ($t) = @_; my $d = $t - time; sleep $d if $d > 0 }

# While the flip phase runs: the API shows h2 with the large lease.
sleep_until($T0 + 2 * $PHASE + 8);
my $api = hosts_api();
my ($h2) = grep { $_->{host_id} eq 'h2' } @{ $api->{hosts} };
my ($l2) = grep { $_->{strategy} == $id{fleet} } @{ $h2->{leases} };
ok($l2 && $l2->{rate} > 150, "after the flip h2 is leased " . ($l2->{rate} // 'nothing') . '/s (> 150)')
    or diag explain $api;
like($api->{leader}{holder} // '', qr/^serve:/, 'serve leads');

sleep_until($T_KILL);
stop_one('serve', 'KILL');
sleep_until($T_BACK);
start_serve($addr);
sleep_until($T_JOIN);
stop_one('agent h0', 'KILL');
$nginx{h0}->stop;
start_host('h3');
push @gen, ['h3', "$dir/gen.h3"];
generator('h3', '/fleet', $T0, $T_END - $T0, "$dir/gen.h3", [0, 150]);
reap(qr/^gen /);
collect();

my @fig;
# 1.0×, 2.0×, flip: convergence, then the 10 s average and the highest second.
for my $p ([0, '1.0x'], [1, '2.0x'], [2, 'flip']) {
    my ($i, $label) = @$p;
    my $from = $T0 + $i * $PHASE;
    my $c = converge($from, $PHASE - 10);
    ok(defined $c, "$label: 3 s in a row within ±5 % of the rate with 10 s of the phase left")
        or diag "$label: per second ", explain seconds($from, $from + $PHASE);
    next unless defined $c;
    my $s = $from + $c;
    my $secs = seconds($s, $s + 10);
    my $avg = 0;
    $avg += $_ / 10 for @$secs;
    my ($max) = sort { $b <=> $a } @$secs;
    my $offered = 0;
    $offered += ($off{$_} // 0) / 10 for $s .. $s + 9;
    push @fig, sprintf "%s: converged in %d s, %.1f %% of the rate over 10 s, max second %d (real nginx; offered %.0f/s, admitted per host %.1f/%.1f/%.1f per s)",
        $label, $c, $avg * 100 / $RATE, $max, $offered, map { per_host($s, 10, "h$_") } 0 .. 2;
    ok($avg >= 0.95 * $RATE && $avg <= 1.02 * $RATE, sprintf "$label: %.1f/s over 10 s after convergence (95–102 %%)", $avg)
        or diag explain [map { [total($_), $adm{$_}, $sent{$_}] } $s .. $s + 9];
    my @all = @{ seconds($from, $from + $PHASE) };
    ok(!grep({ $_ * 100 > $RATE * 105 } @all), "$label: no second above 105 % in the phase") or diag explain \@all;
    ok($c <= 6, "flip: back within ±5 % after $c s (≤ 6)") if $label eq 'flip';
}

# serve killed: never above 105 %; after the lease expiry (5 s, and the
# agent's next poll) each host admits at least 90 % of its static share or
# of what it was offered that second, whichever is less (a generator
# starved of CPU for part of a second offers less; the limiter is not at
# fault then).
my $down = seconds($T_KILL, $T_BACK);
ok(!grep({ $_ * 100 > $RATE * 105 } @$down), 'serve killed: no second above 105 %') or diag explain $down;
my @static = (30, 90, 100);
# What host $h may admit in second $s on its static share: the share, or
# what it was sent if less.
sub static_due {
    my ($s, $h) = @_;
    my $o = $sent{$s}{"h$h"} // 0;
    return $static[$h] < $o ? $static[$h] : $o;
}
my @short = grep {
    my $s = $_;
    grep { ($adm{$s}{"h$_"} // 0) * 100 < static_due($s, $_) * 90 } 0 .. 2
} $T_KILL + 7 .. $T_BACK - 1;
ok(!@short,
    'serve killed: after the lease expiry every host at its static share (30/90/100)')
    or diag explain [map { [$_ - $T_KILL, $adm{$_}, $sent{$_}] } @short];
# The figure: the lowest of admitted / min(offered, static share) over hosts and seconds.
my ($least) = sort { $a <=> $b } map {
    my $s = $_;
    map { my $w = static_due($s, $_); $w ? ($adm{$s}{"h$_"} // 0) / $w : 1 } 0 .. 2
} $T_KILL + 7 .. $T_BACK - 1;
push @fig, sprintf "serve killed %d s: max second %d; after the expiry every host at least %d %% of its static share (or of its offered load if less)",
    $OUTAGE, (sort { $b <=> $a } @$down)[0], 100 * ($least // 0);
my $back = converge($T_BACK, $BACK - 3);
ok(defined $back, 'serve back: within ±5 % of the rate again') or diag explain seconds($T_BACK, $T_JOIN);
push @fig, sprintf "serve back: converged in %s s", $back // 'none';

# h3 joins as h0 dies.
my $join = converge($T_JOIN, $JOIN - 3, ['h3', 90]);
my $seen = seconds($T_JOIN, $T_END);
ok(defined $join, 'h3 joins, h0 dies: re-converged with h3 at its share')
    or diag explain $seen, [map { $adm{$_}{h3} // 0 } $T_JOIN .. $T_END - 1];
# Until its first lease (≤ 2 s: a report, an allocation, the next report)
# h3 enforces its static share, ⌈300 / 4⌉ = 75/s, on top of the leases in
# force (README, residual error): allowed in its first two seconds of traffic.
my $h3_from = $first{h3} // $T_JOIN;
my @over = grep { total($_) * 100 > ($RATE * 105 + ($_ < $h3_from + 2 ? 75 * 100 : 0)) } $T_JOIN .. $T_END - 1;
ok(!@over, 'h3 joins, h0 dies: no second above 105 % (+ h3\'s static 75/s in its first two)')
    or diag 'h3 traffic from second ', $h3_from - $T_JOIN, ': ', explain [map { [total($_), $adm{$_}] } @over];
push @fig, sprintf "h3 joins, h0 dies: re-converged in %s s; max second %d; h3 %.1f/s at the end",
    $join // 'none', (sort { $b <=> $a } @$seen)[0], per_host($T_END - 5, 5, 'h3');

# The per-day quota: all of it on h0.
my ($daily_ok, $daily_sent) = (0, 0);
for (split /\n/, slurp("$dir/gen.daily")) { my (undef, $ok, $sent) = split; $daily_ok += $ok; $daily_sent += $sent }
is($daily_ok, 100, "per-day quota 100, all traffic on h0 ($daily_sent sent): 100 admitted fleet-wide");
push @fig, "per-day quota 100, all traffic on h0: admitted [$daily_ok, 0, 0]";

note $_ for "store: $store_label; builds: " . join(' ', map {"$_=$build{$_}{name}"} sort keys %build), @fig;
$_->stop, $_->no_alerts for map { $nginx{$_} } sort keys %nginx;
stop_all();
done_testing;
