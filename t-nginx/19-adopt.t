# Workers adopt a published table without waiting for traffic (issue 29):
# each watches the file's sequence on a 5 ms timer and builds the new
# table (10,001 strategies: on a helper thread) while nginx is idle, so
# the first requests after the change are decided by it.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    # reuseport spreads the fresh connections over both workers.
    my $n = RateCtlTest->new($t, workers => 2, listen_opts => 'reuseport', server => limited_server());

    my $big = join '', map { "strategy id=$_ algorithm=fixed_window rate=100 per=minute when userid=u$_ api=/y\n" } 1 .. 10_000;
    publish($n->shm, $big, 1);
    $n->start;
    my $loaded = wait_until(5, sub {
        my %w = map { $_ => 1 } $n->error_log =~ /\[notice\] (\d+)#\d+: rate_ctl: .*: enforcing 10000 strategies/g;
        keys %w >= 2;
    });
    ok($loaded, 'both workers enforce the 10,000 strategies');
    sleep 0.5;    # idle: no request since the workers started

    publish($n->shm, $big . "strategy id=10001 algorithm=fixed_window rate=1 per=day when api=/x\n", 2);
    sleep 0.3;
    my @codes = map { $n->get('/x', '-H "Connection: close"')->{code} } 1 .. 6;
    is("@codes", '200 503 503 503 503 503',
        'rate 1 per day added to an idle nginx: 300 ms later only the first of six fresh connections passes');

    $n->stop;
    $n->no_alerts;
});

done_testing;
