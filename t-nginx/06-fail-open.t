# Fail open: no file, corrupt segment, file recreated.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep time);
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t, server => q{ rate_ctl on; location / { empty_gif; } });
    $n->start;

    # No file: requests pass; the condition is logged once per worker, not per request.
    is_deeply([$n->codes('/a', 20)], [(200) x 20], 'no file: all requests pass');
    ok((grep {/^200 FAIL_OPEN - \/a$/} $n->access_log), '$rate_ctl_status FAIL_OPEN');
    my @lines = grep { /rate_ctl/ && /\[error\]/ && index($_, $n->shm) >= 0 } split /\n/, $n->error_log;
    ok(@lines >= 1 && @lines <= 2, scalar(@lines) . ' error line(s) for 20 requests over 2 workers');

    # The file appears: enforcement starts by itself (rechecked once a second).
    publish($n->shm, "strategy id=1 algorithm=fixed_window rate=1 per=day when api=/a\n", 1);
    my $on = $n->rejected_after('/a', 2, time, 4, 0.1);
    ok(defined $on && $on <= 2.5, sprintf('file created: enforced after %.2f s', $on // -1));

    # Corrupt segment: refused, old table kept.
    my $out = `@{[RateCtlTest::tool()]} corrupt @{[$n->shm]} 2>&1`;
    is($?, 0, 'corrupt segment announced') or diag $out;
    sleep 0.3;
    is_deeply([$n->codes('/a', 3)], [503, 503, 503], 'corrupt segment: old table still enforced');
    like($n->error_log, qr/refused segment/, 'refused segment logged');

    # File removed and recreated by the agent: new file picked up.
    unlink $n->shm;
    publish($n->shm, "strategy id=7 algorithm=fixed_window rate=2 per=day when api=/new\n", 9);
    my $again = $n->rejected_after('/new', 3, time, 4, 0.2);
    ok(defined $again && $again <= 2.5, sprintf('file recreated: enforcement resumed after %.2f s', $again // -1));
    $n->stop;
    $n->no_alerts;
});

done_testing;
