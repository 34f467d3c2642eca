# Stats endpoint: counts equal the requests sent; Prometheus output parses,
# its series carry the strategy's name (escaped) beside its id.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        server => stats_server);
    publish($n->shm, <<'T', 42);
strategy id=11 name=login"s\x algorithm=fixed_window rate=4 per=day when api=/s1
strategy id=12 algorithm=token_bucket rate=100 per=second burst=100 when api=/s2
T
    $n->start;
    $n->codes('/s1', 10);
    $n->codes('/s2', 7);
    my $r = $n->get('/rate_ctl');
    is($r->{code}, 200, 'stats 200');
    like($r->{headers}{'content-type'}, qr{application/json}, 'JSON content type');
    my $j = eval { decode_json($r->{body}) };
    ok($j, 'stats JSON parses') or diag $r->{body};
    my %s = map { $_->{id} => $_ } @{ $j->{strategies} // [] };
    is($s{11}{passed}, 4, 'strategy 11 passed 4');
    is($s{11}{limited}, 6, 'strategy 11 limited 6');
    is($s{12}{passed}, 7, 'strategy 12 passed 7');
    is($j->{config_version}, 42, 'config version');
    ok($j->{sequence} >= 1, 'sequence');
    is($j->{active_segment}, $j->{sequence} & 1, 'active segment = sequence & 1');
    ok(defined $j->{heartbeat_age_ms} && $j->{heartbeat_age_ms} < 60_000, 'heartbeat age');

    $r = $n->get('/rate_ctl?format=prometheus');
    like($r->{headers}{'content-type'}, qr{text/plain}, 'prometheus content type');
    my $v = qr/"(?:[^"\\\n]|\\["\\n])*"/;    # a label value, escapes included
    my @bad = grep { !/^# (HELP|TYPE) / && !/^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*=$v(,[a-zA-Z_][a-zA-Z0-9_]*=$v)*\})? -?[0-9.eE+-]+$/ }
        split /\n/, $r->{body};
    ok(!@bad, 'every prometheus line parses') or diag join "\n", @bad;
    like($r->{body}, qr/^rate_ctl_limited_total\{strategy="11",name="login\\"s\\\\x"\} 6$/m,
        'prometheus limited counter, with the name escaped');
    like($r->{body}, qr/^rate_ctl_passed_total\{strategy="12",name=""\} 7$/m, 'prometheus passed counter (no name)');
    is($n->get('/rate_ctl', '-X POST')->{code}, 405, 'POST not allowed');
    $n->stop;
    $n->no_alerts;
});

done_testing;
