# Exact counts, custom statuses, combinations, two strategies, headers.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use RateCtlTest;

sub stats {
    my ($n) = @_;
    my $r = $n->get('/stats');
    my $j = eval { decode_json($r->{body}) } or return {};
    return { map { $_->{id} => $_ } @{ $j->{strategies} } };
}

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        http   => 'rate_ctl_dimension userid $cookie_uid;',
        server => limited_server(
            'location /loc429/ { rate_ctl_status 429; empty_gif; }',
            'location /hdr/ { rate_ctl_headers on; empty_gif; }',
            'location /stats { rate_ctl off; rate_ctl_stats; }',
            'location /named { try_files /nonexistent @named; }',
            'location @named { empty_gif; }',
            'location /err { root /nonexistent; error_page 404 = /errtarget; }',
            'location = /errtarget { empty_gif; }'));
    publish($n->shm, <<'T');
strategy id=1 algorithm=token_bucket rate=5 per=second burst=5 when api=/tb
strategy id=2 algorithm=fixed_window rate=7 per=minute when api=/fw
strategy id=3 algorithm=fixed_window rate=2 per=day action=reject status=429 when api=/own
strategy id=4 algorithm=fixed_window rate=2 per=day when api=/loc429/x
strategy id=5 algorithm=fixed_window rate=1 per=day when ip=127.0.0.1 userid=u1024 api=/pay
strategy id=6 algorithm=fixed_window rate=3 per=day when api=/two
strategy id=7 algorithm=fixed_window rate=10 per=day when method=GET api=/two
strategy id=8 algorithm=fixed_window rate=2 per=day when api=/hdr/x
strategy id=9 algorithm=fixed_window rate=3 per=day when api=/named
strategy id=10 algorithm=fixed_window rate=2 per=day when userid=u-err
T
    $n->start;

    # Token bucket 5/s burst 5: a back-to-back burst of 20 gets 5 (6 if a
    # refill of 200 ms lands inside the burst) 200s, the rest 503.
    my @c = $n->codes('/tb', 20);
    my $ok = RateCtlTest::count_of(200, @c);
    ok($ok == 5 || $ok == 6, "token bucket: $ok of 20 passed (5 or 6)");
    is(RateCtlTest::count_of(503, @c), 20 - $ok, 'token bucket: the rest got 503');

    # A minute window counts exactly: the 15 requests land in one window
    # (strategies that only need a window that never ends here are per day).
    window_ahead(60, 5);
    @c = $n->codes('/fw', 15);
    is(RateCtlTest::count_of(200, @c), 7, 'fixed window 7/min: exactly 7 of 15 passed');
    is(RateCtlTest::count_of(503, @c), 8, 'fixed window: 8 got 503');

    @c = $n->codes('/own', 4);
    is_deeply(\@c, [200, 200, 429, 429], 'strategy status 429 overrides the default');
    @c = $n->codes('/loc429/x', 4);
    is_deeply(\@c, [200, 200, 429, 429], 'rate_ctl_status 429 in the location');

    # Combination: only ip + userid + api together is limited.
    @c = $n->codes('/pay', 3, '-b uid=u1024');
    is_deeply(\@c, [200, 503, 503], 'ip+userid+api combination limited');
    is_deeply([$n->codes('/pay', 3, '-b uid=u2048')], [200, 200, 200], 'other userid passes');
    is_deeply([$n->codes('/payx', 3, '-b uid=u1024')], [200, 200, 200], 'other api passes');
    is_deeply([$n->codes('/pay', 3)], [200, 200, 200], 'no cookie passes');

    # Two strategies: the stricter (3/day) decides; the other does not count
    # the requests it rejected.
    @c = $n->codes('/two', 6);
    is_deeply(\@c, [200, 200, 200, 503, 503, 503], 'two strategies: the stricter decides');
    my $s = stats($n);
    is($s->{6}{passed}, 3, 'stricter strategy passed 3');
    is($s->{6}{limited}, 3, 'stricter strategy limited 3');
    is($s->{7}{passed}, 3, 'other strategy counted only the 3 admitted requests');
    is($s->{7}{limited} // 0, 0, 'other strategy limited none');

    # A request decided once is not counted again after an internal
    # redirect (try_files to a named location, error_page to a URI): both
    # clear the module contexts; the decision is kept in the request's
    # variable values, which survive them.
    @c = $n->codes('/named', 5);
    is_deeply(\@c, [200, 200, 200, 503, 503], 'named location: 3 of 5 passed, each counted once');
    @c = $n->codes('/err', 4, '-b uid=u-err');
    is_deeply(\@c, [200, 200, 503, 503], 'error_page redirect: 2 of 4 passed, each counted once');
    $s = stats($n);
    is($s->{9}{passed}, 3, 'named location: passed counter 3');
    is($s->{10}{passed}, 2, 'error_page redirect: passed counter 2');

    # Headers.
    my $r = $n->get('/hdr/x');
    is($r->{code}, 200, 'headers: first passes');
    is($r->{headers}{'ratelimit-limit'}, 2, 'RateLimit-Limit');
    is($r->{headers}{'ratelimit-remaining'}, 1, 'RateLimit-Remaining');
    ok(($r->{headers}{'ratelimit-reset'} // 0) >= 1, 'RateLimit-Reset present');
    $n->get('/hdr/x');
    $r = $n->get('/hdr/x');
    is($r->{code}, 503, 'headers: third rejected');
    is($r->{headers}{'ratelimit-remaining'}, 0, 'RateLimit-Remaining 0');
    ok(($r->{headers}{'ratelimit-reset'} // 0) >= 1, 'RateLimit-Reset never 0 when limited');
    ok(($r->{headers}{'retry-after'} // 0) >= 1, 'Retry-After on rejection');
    $r = $n->get('/tb');
    ok(!exists $r->{headers}{'ratelimit-limit'}, 'no headers where rate_ctl_headers is off');

    # Access log variables.
    my @log = $n->access_log;
    ok((grep { m{^503 REJECTED 2 /fw$} } @log), '$rate_ctl_status REJECTED and $rate_ctl_strategy logged');
    ok((grep { m{^200 PASSED - /payx$} } @log), 'PASSED without strategy');
    # Logged after the internal redirects: the decision made before them.
    ok((grep { m{^200 PASSED 9 /named$} } @log), 'named location: decision logged after the redirect');
    ok((grep { m{^503 REJECTED 9 /named$} } @log), 'named location: rejection logged');
    ok((grep { m{^200 PASSED 10 /errtarget$} } @log), 'error_page: decision logged at the redirect target');

    # Aggregated logging: 8+ rejections of strategy 2 within a second are
    # not one line each.
    my $lines = () = $n->error_log =~ /rejecting request by strategy 2\b/g;
    ok($lines >= 1 && $lines <= 2, "rejections of one strategy logged once per worker and second ($lines)");
    $n->stop;
    $n->no_alerts;
});

done_testing;
