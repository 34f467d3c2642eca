# Delay action through nginx timers; concurrency slots held for the life of
# a request and released at its end, also when the client aborts.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        # 24 KiB at 8 KiB/s: each request lasts about 2 s.
        server => limited_server('location /slow/ { limit_rate 8k; limit_rate_after 0; }'));
    open my $fh, '>', $n->dir . '/html/big' or die;
    print $fh 'x' x 24576;
    close $fh;
    mkdir $n->dir . '/html/slow';
    link $n->dir . '/html/big', $n->dir . '/html/slow/big' or die $!;
    publish($n->shm, <<'T');
strategy id=1 algorithm=leaky_bucket rate=10 per=second action=delay max_delay_ms=450 when api=/d
strategy id=2 algorithm=concurrency rate=2 when api=/slow/big
T
    $n->start;

    # Leaky bucket 10/s as a queue: 5 sequential requests are spaced 100 ms.
    my $t0 = time;
    my @c = $n->codes('/d', 5);
    my $el = time - $t0;
    is_deeply(\@c, [(200) x 5], 'delayed requests all pass');
    ok($el >= 0.35 && $el < 1.5, sprintf('5 requests at 10/s took %.3f s (expected ~0.4)', $el));
    ok((grep { m{^200 DELAYED 1 /d$} } $n->access_log), '$rate_ctl_status DELAYED');

    # 10 in parallel: waits 0,100,...,900 ms; over the 450 ms cap → rejected.
    sleep 1.2;
    $t0 = time;
    my $urls = join ' ', map { "-o /dev/null '" . $n->url('/d') . "'" } 1 .. 10;
    @c = split /\n/, `curl -s --no-progress-meter -m 10 --parallel --parallel-immediate --parallel-max 10 -w '%{http_code}\\n' $urls`;
    my $ok = RateCtlTest::count_of(200, @c);
    ok($ok >= 4 && $ok <= 6, "parallel burst: $ok of 10 admitted within the 450 ms cap");
    is(RateCtlTest::count_of(503, @c), 10 - $ok, 'the rest rejected, not delayed beyond the cap');
    ok(time - $t0 < 2, 'no request waited beyond the cap');

    # Concurrency 2: two slow downloads hold both slots.
    my @bg;
    for (1 .. 2) {
        my $pid = fork // die;
        if (!$pid) { exec 'curl', '-s', '-o', '/dev/null', $n->url('/slow/big'); exit 1 }
        push @bg, $pid;
    }
    sleep 0.5;
    is($n->get('/slow/big', '-m 0.3')->{code}, 503, 'third concurrent request rejected');
    waitpid $_, 0 for @bg;
    my @after = $n->codes('/slow/big', 1);
    is($after[0], 200, 'after both finished a request passes again');

    # Aborting clients free their slots.
    for (1 .. 2) {
        my $pid = fork // die;
        if (!$pid) { exec 'curl', '-s', '-o', '/dev/null', '-m', '0.4', $n->url('/slow/big'); exit 1 }
        push @bg, $pid;
    }
    waitpid $_, 0 for @bg;
    sleep 1.5;    # nginx notices the closed sockets on its next limited write
    my $r = $n->get('/slow/big', '-m 0.5');
    isnt($r->{code}, 503, 'slots of aborted clients were released (' . $r->{code} . ')');
    $n->stop;
    $n->no_alerts;
});

done_testing;
