# Changes without reload, counters shared by workers, counters kept over reload.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    # reuseport spreads new connections over both workers.
    my $n = RateCtlTest->new($t,
        listen_opts => 'reuseport',
        server => limited_server('add_header X-Worker $pid always;'));

    publish($n->shm, "strategy id=1 algorithm=fixed_window rate=100 per=minute when api=/a\n", 1);
    $n->start;
    # Each worker maps the file and compiles the table as it starts, before
    # any request (so no request waits for a build).
    my (%loaded, $deadline);
    $deadline = time + 3;
    while (time < $deadline) {
        %loaded = map { $_ => 1 }
            $n->error_log =~ /\[notice\] (\d+)#\d+: rate_ctl: .*: enforcing 1 strategies/g;
        last if keys %loaded >= $n->{workers};
        sleep 0.05;
    }
    is(scalar keys %loaded, $n->{workers}, 'every worker logged its table at start');
    is_deeply([sort keys %loaded], [sort $n->worker_pids], 'the workers running are the ones that loaded it, before any request');
    is_deeply([$n->codes('/a', 5)], [(200) x 5], 'generous limit: all pass');

    # Tighten while nginx runs; no reload.
    my $t0 = time;
    publish($n->shm, "strategy id=1 algorithm=fixed_window rate=100 per=minute when api=/a\n"
        . "strategy id=2 algorithm=fixed_window rate=1 per=minute when api=/b\n", 2);
    my $applied = $n->rejected_after('/b', 2, $t0, 3, 0.05);
    ok(defined $applied && $applied <= 1.0, sprintf('new strategy enforced %.3f s after publish, no reload', $applied // -1));

    # Both workers share one counter: 40 requests on fresh connections,
    # fixed window 20/day, exactly 20 pass whichever worker answers.
    publish($n->shm, "strategy id=3 algorithm=fixed_window rate=20 per=day when api=/shared\n", 3);
    sleep 0.3;
    my (%pids, $ok);
    for (1 .. 40) {
        my $r = $n->get('/shared', '-H "Connection: close"');
        $pids{ $r->{headers}{'x-worker'} // 'none' }++;
        $ok++ if $r->{code} == 200;
    }
    is($ok, 20, 'two workers: exactly 20 of 40 passed in total');
    is(scalar(keys %pids), 2, 'both workers answered: ' . join(',', sort keys %pids));

    # A large table (5,000 strategies: built by a helper thread of each
    # worker, core/loader.rs) is enforced within a second or two while the
    # workers keep answering; the reload below then shows nginx's signals
    # still reach the workers that started such a thread.
    my $big = join '', map { "strategy id=$_ algorithm=fixed_window rate=100 per=minute when userid=u$_ api=/x\n" } 10 .. 5009;
    $t0 = time;
    publish($n->shm, $big . "strategy id=5 algorithm=fixed_window rate=1 per=minute when api=/big\n", 5);
    my ($big_applied, @during);
    while (time - $t0 < 5) {
        my @c = $n->codes('/big', 2);
        push @during, $c[0];
        if ($c[1] == 503) { $big_applied = time - $t0; last }
        sleep 0.05;
    }
    ok(defined $big_applied && $big_applied <= 3.0, sprintf('5,000-strategy table enforced %.3f s after publish', $big_applied // -1));
    is_deeply([grep { $_ != 200 && $_ != 503 } @during], [], 'requests answered while it was built');

    # Reload keeps counters: the per-minute window is not reset.
    publish($n->shm, "strategy id=4 algorithm=fixed_window rate=5 per=minute when api=/reload\n", 4);
    sleep 0.3;
    window_ahead(60, 10);    # the 3 requests, the reload and 4 more in one minute window
    is_deeply([$n->codes('/reload', 3)], [200, 200, 200], '3 of 5 used before reload');
    $n->reload;
    is_deeply([$n->codes('/reload', 4)], [200, 200, 503, 503], 'after nginx -s reload only 2 remain');

    $n->stop;
    $n->no_alerts;
});

done_testing;
