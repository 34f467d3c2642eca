# Fixed and sliding windows are UTC minutes (hours, days) on every host: two
# nginx instances (both builds, each with its own file, like two hosts)
# reset a per-minute window exactly at the UTC minute boundary. One wait for
# the boundary serves every instance (at most 60 s in all).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX qw(fmod);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my @hosts;
for my $t (RateCtlTest::targets()) {
    my $n = RateCtlTest->new($t,
        workers => 1,
        server  => q{
            rate_ctl on;
            location / { empty_gif; }
        });
    publish($n->shm, <<'T');
strategy id=1 algorithm=fixed_window rate=2 per=minute when api=/f
strategy id=2 algorithm=sliding_window rate=2 per=minute when api=/s
T
    $n->start;
    push @hosts, $n;
}

# Not within 3 s of a boundary: the first burst and the check before the
# boundary must fall in one UTC minute.
sleep(60 - fmod(time, 60) + 0.2) if 60 - fmod(time, 60) < 3;
my $boundary = time - fmod(time, 60) + 60;
for my $n (@hosts) {
    my $name = $n->{t}{name};
    is_deeply([$n->codes('/f', 3)], [200, 200, 503], "$name: fixed window: 2 of 3 pass");
    is_deeply([$n->codes('/s', 3)], [200, 200, 503], "$name: sliding window: 2 of 3 pass");
}
sleep($boundary - 1 - time) if $boundary - 1 > time;
for my $n (@hosts) {
    my $name = $n->{t}{name};
    is($n->get('/f')->{code}, 503, "$name: fixed window: still limited 1 s before the UTC minute ends");
}
sleep($boundary + 0.3 - time);
for my $n (@hosts) {
    my $name = $n->{t}{name};
    is_deeply([$n->codes('/f', 3)], [200, 200, 503], "$name: fixed window: a new one at the UTC minute");
    # Sliding: the previous minute still weighs ~99 % (2 × 0.99 → 1), one passes.
    is_deeply([$n->codes('/s', 2)], [200, 503], "$name: sliding window: its previous minute is the UTC one");
}
for my $n (@hosts) {
    $n->stop;
    $n->no_alerts;
}

done_testing;
