# Faults from the fault campaign (issue 11) against real nginx workers:
# the file truncated or rewritten in place under load, RateLimit-Reset on a
# concurrency strategy, a worker killed while it holds concurrency units.
# The README's "Faults" table is kept true by these checks.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep time);
use File::Copy qw(copy);
use RateCtlTest;

# Runs `wrk` against $url for $secs seconds in the background; returns its pid.
sub load {
    my ($url, $secs) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDOUT, '>', '/dev/null';
        open STDERR, '>', '/dev/null';
        exec 'wrk', '-t1', '-c8', "-d${secs}s", $url;
        exit 127;
    }
    return $pid;
}

sub wait_for {
    my ($secs, $cond) = @_;
    my $t0 = time;
    while (time - $t0 < $secs) {
        return time - $t0 if $cond->();
        sleep 0.05;
    }
    return;
}

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t, server => q{
        rate_ctl on;
        rate_ctl_headers on;
        location / { empty_gif; }
        location = /rate_ctl { rate_ctl off; rate_ctl_stats; }
    });
    $n->start;
    my @workers = sort $n->worker_pids;

    # 1. Truncation and in-place rewrites under load never kill a worker:
    # the SIGBUS is caught, the worker fails open with one log line, and
    # enforcement resumes by itself when the file is whole again.
    publish($n->shm, "strategy id=1 algorithm=fixed_window rate=1 per=day when api=/a\n", 1);
    # Workers look for a file that was missing once a second.
    my $on = wait_for(4, sub { ($n->codes('/a', 1))[0] == 503 });
    ok(defined $on, 'enforcing before the fault');
    my $backup = $n->dir . '/backup';
    copy($n->shm, $backup) or die "copy: $!";

    my $wrk = load($n->url('/a'), 4);
    sleep 0.3;
    truncate $n->shm, 4096 or die "truncate: $!";
    is(-s $n->shm, 4096, 'file truncated to 4096 bytes');
    sleep 0.3;
    my $stats = $n->get('/rate_ctl');
    is($stats->{code}, 200, '/stats answers after the truncation');
    my @open = $n->codes('/a', 4);
    is_deeply(\@open, [200, 200, 200, 200], 'truncated file: requests pass (fail open)');

    # In-place restore (cp truncates first), repeated under load.
    for (1 .. 5) {
        system('cp', $backup, $n->shm) == 0 or die "cp failed";
        sleep 0.1;
    }
    my $back = wait_for(4, sub { ($n->codes('/a', 1))[0] == 503 });
    ok(defined $back, sprintf('file whole again: enforcement resumed after %.2f s', $back // -1));
    waitpid $wrk, 0;

    my $log = $n->error_log;
    unlike($log, qr/exited on signal/, 'no worker exited on a signal');
    is_deeply([sort $n->worker_pids], \@workers, 'the same workers still run');
    like($log, qr/rate_ctl: .*(SIGBUS caught|shrank to 4096 bytes)/, 'the fault is logged');
    my $lines = () = $log =~ /SIGBUS caught/g;
    ok($lines <= 2 * @workers * 6, "$lines SIGBUS lines: at most one per worker per fault");

    # 9. RateLimit-Reset is at least 1 s, also for a concurrency strategy
    # with capacity left (its state has no time in it).
    publish($n->shm, "strategy id=2 algorithm=concurrency rate=5 when api=/c\n", 2);
    sleep 0.3;
    my $c = $n->get('/c');
    is($c->{code}, 200, 'concurrency strategy with capacity left passes');
    is($c->{headers}{'ratelimit-remaining'}, 4, 'RateLimit-Remaining 4 of 5');
    cmp_ok($c->{headers}{'ratelimit-reset'} // 0, '>=', 1, 'RateLimit-Reset >= 1 with capacity left');

    $n->stop;
    $n->no_alerts;
});

done_testing;
