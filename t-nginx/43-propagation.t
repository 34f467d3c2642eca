# End to end propagation (issue 29): `rate-ctl strategy add` returned →
# every nginx worker enforces it, through the real agent and a real store
# holding PROPAGATION_N (10,000) other strategies, 2 workers (reuseport).
#
#   (a) a `rate 1 per day` strategy added to an idle nginx: 300 ms after
#       the add returned, six requests on fresh connections are exactly
#       [200, 503, 503, 503, 503, 503] (no request decided by the old table);
#   (b) 8 keep-alive connections probe the new strategy's path back to back;
#       PROPAGATION_TRIALS (12) trials of "add returned → every connection
#       has answered 503": the largest is at most PROPAGATION_MAX_MS.
#
# The CI bound is what the design guarantees on a loaded machine, whatever
# the timing: the agent's backstop poll (50 ms) + reading one changed row +
# one publish of the whole table (~150-300 ms for 10,000 strategies with
# the debug binary CI runs, a few ms with a release one) + the workers'
# 5 ms watch timer and table build: 1,500 ms with a debug binary (730 ms
# measured with the load average at 8), 100 ms
# with a release one (RATE_CTL_BIN). Before issue 29 the agent re-read the
# whole table at every change: 1.5 s in debug. Since the agent derives and
# the writer walks only what changed (session 16), the debug binary's max
# is 45-49 ms on both builds (load average 1.2): the bound keeps its margin
# for a loaded CI machine. The figures are printed;
# scripts/propagation.sh runs this suite with the strict bound (20 ms) on a
# release build.
#
# PROPAGATION_TIMES=1 prints each trial's clock times (with RATE_CTL_KEEP=1
# the agent's log stays, to line them up with its `configuration read` and
# `published` lines).
#
# Store: PROPAGATION_STORE = sqlite (default), postgres
# (RATE_CTL_TEST_POSTGRES_URL), mariadb (RATE_CTL_TEST_MYSQL_URL), or
# serve (`rate-ctl serve` over SQLite; CLI --api, agent --store http://).
# A server store must be an empty database of its own.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use IO::Socket::IP;
use List::Util qw(pairs);
use POSIX qw(floor);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $bin    = rate_ctl_bin();
my $N      = $ENV{PROPAGATION_N}      // 10_000;
my $TRIALS = $ENV{PROPAGATION_TRIALS} // 12;
my $BOUND  = $ENV{PROPAGATION_MAX_MS} // ($bin =~ m{/release/} ? 100 : 1500);
my $CONNS  = 8;
my $kind   = $ENV{PROPAGATION_STORE}  // 'sqlite';

# A day window must not end in the middle of the test (UTC midnight).
RateCtlTest::window_ahead(86_400, 300);
my $dir = tempdir('rate_ctl_i29push_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
chmod 0755, $dir;
$SIG{INT} = $SIG{TERM} = sub { stop_all(); exit 130 };

my ($store, @cli);
if ($kind eq 'sqlite' || $kind eq 'serve') {
    $store = "sqlite:$dir/store.db";
} elsif ($kind eq 'postgres') {
    $store = $ENV{RATE_CTL_TEST_POSTGRES_URL} or plan skip_all => 'RATE_CTL_TEST_POSTGRES_URL not set';
} elsif ($kind eq 'mariadb') {
    $store = $ENV{RATE_CTL_TEST_MYSQL_URL} or plan skip_all => 'RATE_CTL_TEST_MYSQL_URL not set';
} else {
    BAIL_OUT("PROPAGATION_STORE: sqlite, postgres, mariadb or serve, not $kind");
}
@cli = ('--store', $store);

# The background table: N host-scope strategies no probe matches.
{
    open my $fh, '>', "$dir/big.jsonl" or die $!;
    for my $i (1 .. $N) {
        print $fh qq({"name":"bg$i","algorithm":"fixed_window","rate":100,"per":"minute","scope":"host",)
            . qq("match":{"userid":"u$i","api":"/y"}}\n);
    }
    close $fh;
    my $out = `$bin strategy import --replace --store '$store' $dir/big.jsonl 2>&1`;
    is($?, 0, "$N strategies imported") or BAIL_OUT($out);
}

my $agent_store = $store;
if ($kind eq 'serve') {
    spawn('serve', "$dir/serve.log", $bin, 'serve', '--store', $store, '--listen', '127.0.0.1:0',
        '--admin-token-file', "$dir/admin.token");
    my $addr = wait_until(20, sub { (slurp("$dir/serve.log") =~ /listening on http:\/\/(\S+)\s*$/m)[0] })
        or BAIL_OUT('serve did not start: ' . slurp("$dir/serve.log"));
    my $token = slurp("$dir/admin.token");
    chomp $token;
    @cli = ('--api', "http://$addr", '--token', $token);
    $agent_store = "http://$addr";
    push @cli, ();
    $ENV{RATE_CTL_TOKEN} = $token;    # the agent's --token
}

# `rate-ctl strategy add` of a `rate 1 per day` strategy on $path; returns
# the time it returned.
sub add_strategy {
    my ($name, $path) = @_;
    my @argv = ($bin, 'strategy', 'add', @cli, '--name', $name, '--algorithm', 'fixed_window', '--rate', 1,
        '--per', 'day', '--scope', 'host', '--match', "api=$path");
    my $out = qx{@{[join ' ', map {"'$_'"} @argv]} 2>&1};
    my $t = time;
    die "strategy add $name: $out" if $?;
    return $t;
}

# One request on a keep-alive connection (reconnecting if nginx closed it);
# its status code.
sub request {
    my ($c, $port, $path) = @_;
    for (1 .. 2) {
        $c->{s} //= IO::Socket::IP->new(PeerHost => '127.0.0.1', PeerPort => $port) or die "connect: $!";
        my $s = $c->{s};
        if (syswrite($s, "GET $path HTTP/1.1\r\nHost: t\r\n\r\n")) {
            my $buf = '';
            while ($buf !~ /\r\n\r\n/) { sysread($s, $buf, 65536, length $buf) or last }
            if ($buf =~ m{^HTTP/1\.1 (\d{3})}) {
                my $code = $1;
                my ($len) = $buf =~ /\r\nContent-Length: (\d+)/i;
                my $have = length($buf) - (index($buf, "\r\n\r\n") + 4);
                while ($have < ($len // 0)) { my $n = sysread($s, $buf, 65536, length $buf) or last; $have += $n }
                delete $c->{s} if $buf =~ /\r\nConnection: close/i;
                return $code;
            }
        }
        delete $c->{s};
    }
    die "no answer on a fresh connection to 127.0.0.1:$port";
}

sub pct {
    my ($p, @v) = @_;
    @v = sort { $a <=> $b } @v;
    return $v[ floor($p / 100 * $#v + 0.5) ];
}

my $round = 0;
for_each_target(sub {
    my ($t) = @_;
    my $tn = $t->{name};
    $round++;
    my $shm = "$dir/$tn.shm";
    spawn("agent $tn", "$dir/agent-$tn.log", $bin, 'agent', '--store', $agent_store, '--shm', $shm,
        '--host-id', "h$tn", '--max-strategies', $N + 1024, '--segment-bytes', 256 * ($N + 1024) + 65536,
        '--blacklist-entries', 256, '--keys', 4096, agent_access());
    my $published = wait_until(60, sub { slurp("$dir/agent-$tn.log") =~ /published:/ });
    ok($published, "$tn: the agent published the table") or diag slurp("$dir/agent-$tn.log");
    my $n = RateCtlTest->new($t, workers => 2, listen_opts => 'reuseport', shm => $shm, main => workers_main(),
        server => limited_server());
    $n->start;
    my $loaded = wait_until(30, sub {
        my %w = map { $_->[0] => 1 } grep { $_->[1] >= $N } pairs($n->error_log =~ /\[notice\] (\d+)#\d+: rate_ctl: .*: enforcing (\d+) strategies/g);
        keys %w >= 2;
    });
    ok($loaded, "$tn: both workers enforce the $N strategies") or diag $n->error_log;

    # (a) Idle nginx, then one strategy; fresh connections 300 ms later.
    sleep 0.5;
    my $done = add_strategy("fresh-$tn", "/fresh-$tn");
    sleep(0.3 - (time - $done)) if time - $done < 0.3;
    my @codes = map { $n->get("/fresh-$tn", '-H "Connection: close"')->{code} } 1 .. 6;
    is("@codes", '200 503 503 503 503 503',
        "$tn: rate 1 per day added to an idle nginx: 300 ms later only the first of six fresh connections passes");

    # (b) Keep-alive probes: add returned → every connection answered 503.
    my @conns = map { {} } 1 .. $CONNS;
    request($_, $n->port, '/warm') for @conns;
    my @lat;
    for my $i (1 .. $TRIALS) {
        my $path = "/p$i-$tn";
        pipe(my $r, my $w) or die $!;
        my $pid = fork // die "fork: $!";
        if (!$pid) {
            close $r;
            my $at = eval { add_strategy("p$i-$tn", $path) } // -1;
            print $w "$at\n";
            close $w;
            POSIX::_exit(0);
        }
        close $w;
        my %first;
        my $end = time + 10;
        while (keys %first < $CONNS && time < $end) {
            for my $k (0 .. $#conns) {
                next if $first{$k};
                my $code = request($conns[$k], $n->port, $path);
                $first{$k} = time if $code == 503;
            }
            sleep 0.0002;
        }
        my $returned = <$r>;
        waitpid $pid, 0;
        chomp $returned if defined $returned;
        if (!$returned || $returned < 0 || keys %first < $CONNS) {
            fail("$tn: trial $i: " . (keys %first) . " of $CONNS connections answered 503 within 10 s");
            next;
        }
        my ($last) = sort { $b <=> $a } values %first;
        my ($firstok) = sort { $a <=> $b } values %first;
        # PROPAGATION_TIMES=1: each trial's clock times, to line up with
        # the agent's log (RATE_CTL_KEEP=1 keeps it).
        diag sprintf('trial %d: add returned at %.6f; first connection 503 +%.1f ms, last +%.1f ms',
            $i, $returned, ($firstok - $returned) * 1000, ($last - $returned) * 1000)
            if $ENV{PROPAGATION_TIMES};
        push @lat, ($last - $returned) * 1000;
        sleep 0.2;
    }
    my $max = @lat ? (sort { $b <=> $a } @lat)[0] : 1e9;
    my $fig = sprintf('propagation: store=%s n=%d target=%s trials=%d p50=%.1f ms p90=%.1f ms max=%.1f ms',
        $kind, $N, $tn, scalar @lat, pct(50, @lat), pct(90, @lat), $max);
    diag $fig;
    diag sprintf('trials (ms): %s', join ' ', map { sprintf '%.1f', $_ } @lat);
    ok(@lat == $TRIALS && $max <= $BOUND,
        "$tn: add returned → all $CONNS keep-alive connections answer 503: max over $TRIALS trials <= $BOUND ms")
        or diag slurp("$dir/agent-$tn.log");
    close $_->{s} for grep { $_->{s} } @conns;
    $n->stop;
    $n->no_alerts;
    stop_one("agent $tn");
});

stop_all();
done_testing;
