# Behaving like nginx's own limiters where nginx users rely on it: the
# phase order after realip and limit_req, internal redirects, subrequests
# (auth_request, mirror, SSI).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use RateCtlTest;

sub stats_of {
    my ($n) = @_;
    my $j = decode_json($n->get('/rate_ctl')->{body});
    return { map { $_->{id} => $_ } @{ $j->{strategies} } };
}

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        http   => q{
            rate_ctl_dimension userid $cookie_uid;
            limit_req_zone $uri zone=lr:1m rate=1r/m;
        },
        server => q{
            rate_ctl on;
            location / { empty_gif; }
            location = /rate_ctl { rate_ctl off; rate_ctl_stats; }
            # realip in a location registers a PREACCESS handler.
            location /rip/ {
                set_real_ip_from 127.0.0.1;
                real_ip_header X-Real-IP;
                empty_gif;
            }
            location /lr/ { limit_req zone=lr nodelay; empty_gif; }
            # internal redirects
            location /tf2/ { try_files /nonexistent /x; }
            location = /x { empty_gif; }
            location /tf3/ { try_files /nonexistent /y; }
            location = /y { empty_gif; }
            location /ix/ { index index.html; }
            # subrequests
            location /ar/ { auth_request /auth; empty_gif; }
            location = /auth { internal; empty_gif; }
            location /ar2/ { auth_request /auth2; empty_gif; }
            location = /auth2 { internal; empty_gif; }
            location /mr/ { mirror /mirror; empty_gif; }
            location = /mirror { internal; empty_gif; }
            location /ssi/ { ssi on; }
            location = /inc { internal; }
            location = /incd { internal; }
            location /ard/ { auth_request /authd; empty_gif; }
            location = /authd { internal; empty_gif; }
            location /dryloc/ { rate_ctl_dry_run on; empty_gif; }
        });
    my $html = $n->dir . '/html';
    mkdir "$html/$_" for qw(ix ssi);
    for (["$html/ix/index.html", "index\n"], ["$html/ssi/page.html", "a<!--# include virtual=\"/inc\" -->b\n"],
        ["$html/inc", "INC"], ["$html/incd", "D"],
        ["$html/ssi/delays.html", "a<!--# include virtual=\"/incd\" -->b<!--# include virtual=\"/incd\" -->c\n"]) {
        open my $fh, '>', $_->[0] or die $!;
        print $fh $_->[1];
        close $fh;
    }
    publish($n->shm, <<'T');
blacklist ip 10.9.9.9
strategy id=1 algorithm=fixed_window rate=1 per=day when ip=10.1.2.3 api=/rip/a
strategy id=2 algorithm=fixed_window rate=2 per=day when api=/x
strategy id=3 algorithm=fixed_window rate=1 per=day when api=/ix/index.html
strategy id=4 algorithm=fixed_window rate=3 per=day when userid=u9
strategy id=5 algorithm=fixed_window rate=2 per=day when api=/auth
strategy id=6 algorithm=fixed_window rate=100 per=day when api=/ar2/x
strategy id=7 algorithm=fixed_window rate=1 per=day when api=/auth2
strategy id=8 algorithm=fixed_window rate=2 per=day when api=/mirror
strategy id=9 algorithm=fixed_window rate=1 per=day when api=/inc
strategy id=10 algorithm=fixed_window rate=100 per=day when api=/lr/a
strategy id=11 algorithm=leaky_bucket rate=1 per=second action=dry_run max_delay_ms=2000 when api=/dd
strategy id=12 algorithm=leaky_bucket rate=1 per=second action=delay max_delay_ms=2000 when api=/dryloc/d
strategy id=13 algorithm=fixed_window rate=1 per=day when usrid=u1
strategy id=14 algorithm=fixed_window rate=1 per=day when userid=u1 api=/u
strategy id=15 algorithm=leaky_bucket rate=4 per=second action=delay max_delay_ms=1000 when api=/incd
strategy id=16 algorithm=leaky_bucket rate=4 per=second action=delay max_delay_ms=1000 when api=/authd
T
    $n->start;

    # 1. Phase order: after realip's location handler and after limit_req.
    is($n->get('/rip/a', '-H "X-Real-IP: 10.9.9.9"')->{code}, 403,
        'realip in a location: the blacklisted real address is refused');
    is_deeply([$n->codes('/rip/a', 2, '-H "X-Real-IP: 10.1.2.3"')], [200, 503],
        'realip in a location: an ip strategy limits the real address');
    is($n->get('/rip/a', '-H "X-Real-IP: 10.1.2.4"')->{code}, 200, 'another real address is not limited');
    is_deeply([$n->codes('/lr/a', 2)], [200, 503], 'limit_req in the same location rejects the second request');

    # 2. Internal redirects: a location that matched nothing does not decide.
    is_deeply([map { $n->get("/tf2/$_")->{code} } qw(a b c)], [200, 200, 503],
        'try_files onto a limited URI is limited (rate 2)');
    is_deeply([$n->codes('/ix/', 2)], [200, 503], 'index onto a limited URI is limited (rate 1)');
    is_deeply([$n->codes('/tf3/q', 4, '-b uid=u9')], [200, 200, 200, 503],
        'a strategy applied before a redirect is charged once per request (rate 3)');

    # 3. Subrequests, limit_req's rule: evaluated unless the main request is decided.
    is_deeply([$n->codes('/ar/x', 3)], [200, 200, 500],
        'auth_request subrequest limited (rate 2); auth_request answers 500 for its 503');
    is_deeply([$n->codes('/ar2/x', 3)], [200, 200, 200],
        'auth_request of a request a strategy already decided is not evaluated');
    is_deeply([$n->codes('/mr/x', 3)], [200, 200, 200], 'mirror: the main request is not affected');
    my $ssi1 = $n->get('/ssi/page.html');
    my $ssi2 = $n->get('/ssi/page.html');
    like($ssi1->{body}, qr/^aINCb/, 'SSI include served under its limit');
    like($ssi2->{body}, qr/^a.*503 Service Temporarily Unavailable.*b$/s,
        'SSI include refused over its limit (rate 1): its error page in its place');
    # 4. A dry run of a delay predicts it: charged, counted delayed, never waited.
    my $t0 = time;
    is_deeply([$n->codes('/dd', 2)], [200, 200], 'dry-run delay strategy: both served');
    is_deeply([$n->codes('/dryloc/d', 2)], [200, 200], 'delay strategy in a dry-run location: both served');
    ok(time - $t0 < 0.9, sprintf('nobody waited (%.3f s for 4 requests; enforcement would wait ~1 s each)', time - $t0));

    # 6. A dimension this nginx does not define: logged once per table load
    # (per worker), in the stats and in `rate-ctl shm inspect`.
    $n->codes('/u', 3, '-b uid=u1');
    my @workers = $n->worker_pids;
    my @undef = grep {/dimension "usrid" is not defined in this nginx .*strategies 13 never match here/}
        split /\n/, $n->error_log;
    is(scalar @undef, scalar @workers, 'undefined dimension logged once per worker, not per request')
        or diag join "\n", @undef;
    my $inspect = decode_json(scalar `@{[root()]}/target/debug/rate-ctl shm inspect @{[$n->shm]} --json`);
    my %row = map { $_->{id} => $_ } @{ $inspect->{strategies} };
    ok($row{13}{dimension_undefined_in_nginx}, 'shm inspect: strategy 13 marked');
    ok(!$row{14}{dimension_undefined_in_nginx}, 'shm inspect: strategy 14 (defined dimension) not marked');

    # Delays in subrequests: an SSI include (evaluated once per page, as
    # limit_req does: the first include decides the page) and an
    # auth_request subrequest wait their turn and then complete.
    is($n->get('/ssi/delays.html')->{body}, "aDbDc\n", 'SSI page: first include not delayed');
    my $t1 = time;
    my $d = $n->get('/ssi/delays.html');
    my $el = time - $t1;
    is($d->{body}, "aDbDc\n", 'SSI page with a delayed include completes');
    ok($el >= 0.2 && $el < 2, sprintf('its include waited its 250 ms turn (%.3f s)', $el));
    $t1 = time;
    is_deeply([$n->codes('/ard/x', 2)], [200, 200], 'delayed auth_request subrequests complete');
    $el = time - $t1;
    ok($el >= 0.2 && $el < 2, sprintf('the second auth_request waited its turn (%.3f s)', $el));

    my $s;
    for (1 .. 40) {    # mirror subrequests finish in the background
        $s = stats_of($n);
        last if ($s->{8}{passed} // 0) + ($s->{8}{limited} // 0) >= 3;
        sleep 0.05;
    }
    is($s->{8}{passed},  2, 'mirror subrequests: 2 passed');
    is($s->{8}{limited}, 1, 'mirror subrequests: 1 limited');
    is($s->{7}{passed} + $s->{7}{limited}, 0, 'auth2 never evaluated');
    is($s->{10}{passed}, 1, 'limit_req ran first: rate_ctl counted only the request it let through');
    is_deeply(decode_json($n->get('/rate_ctl')->{body})->{undefined_dimensions}, { usrid => [13] },
        'stats: undefined_dimensions');
    for my $id (11, 12) {
        is_deeply([@{ $s->{$id} }{qw(passed limited delayed)}], [2, 0, 1],
            "strategy $id: passed/limited/delayed 2/0/1, as enforcement would count");
    }

    my @log = $n->access_log;
    ok((grep { m{^503 - - /lr/a$} } @log), 'a request limit_req rejected has no $rate_ctl_status')
        or diag join "\n", grep {m{/lr/}} @log;
    ok((grep { m{^200 PASSED 2 /x$} } @log), 'the redirected request reports the strategy of its new location');
    ok((grep { m{^200 DRY_RUN_DELAYED 11 /dd$} } @log), 'dry-run strategy: $rate_ctl_status DRY_RUN_DELAYED');
    ok((grep { m{^200 DRY_RUN_DELAYED 12 /dryloc/d$} } @log), 'dry-run location: $rate_ctl_status DRY_RUN_DELAYED');
    my $err = $n->error_log;
    like($err, qr/would delay request by (9\d\d|1000) ms \(dry run\) by strategy 11/, 'would-be delay logged (strategy)');
    like($err, qr/would delay request by (9\d\d|1000) ms \(dry run\) by strategy 12/, 'would-be delay logged (location)');
    unlike($err, qr/would reject request \(dry run\) by strategy 1[12]/, 'no would-be rejection reported');
    $n->stop;
    $n->no_alerts;
});

done_testing;
