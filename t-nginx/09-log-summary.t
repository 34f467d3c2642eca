# Rejection summaries: written by a timer when their window closes (no other
# request needed) and when a worker exits (reload), in the worker's context,
# never another request's; the counts in the log add up to the stats.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep);
use RateCtlTest;

# Rejections the log accounts for, per strategy: one per "rejecting request"
# line (the first of a window, logged with its request) plus the summaries.
sub logged_rejections {
    my ($log, $id) = @_;
    my $n = () = $log =~ /rejecting request by strategy $id\b/g;
    $n += $1 while $log =~ /strategy $id rejected (\d+) more requests/g;
    return $n;
}

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        server => stats_server);
    publish($n->shm, <<'T');
strategy id=1 algorithm=fixed_window rate=1 per=day when api=/r
strategy id=2 algorithm=fixed_window rate=1 per=day when api=/q
T
    $n->start;

    # The timer: rejections, then silence; the summary still comes.
    $n->codes('/q', 6);
    sleep 1.6;
    my @summary = grep {/strategy 2 rejected \d+ more requests/} split /\n/, $n->error_log;
    ok(@summary, 'summary written when its window closed, with no later request') or diag $n->error_log;
    ok(!(grep {/client:|request:/} @summary), 'summary carries no request context') or diag join "\n", @summary;
    is(logged_rejections($n->error_log, 2), 5, 'strategy 2: 5 rejections in the log');

    # Worker exit: rejections right before a reload are not lost.
    $n->codes('/r', 40);
    $n->reload;
    my $s = decode_json($n->get('/rate_ctl')->{body});
    my %s = map { $_->{id} => $_ } @{ $s->{strategies} };
    is($s{1}{limited}, 39, 'stats: strategy 1 limited 39');
    is(logged_rejections($n->error_log, 1), $s{1}{limited}, 'the log accounts for every rejection the stats count');
    $n->stop;
    $n->no_alerts;
});

done_testing;
