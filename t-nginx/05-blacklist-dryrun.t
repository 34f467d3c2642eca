# Blacklist (IPv4, IPv6, userid, expiry) and dry run (per strategy and per location).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        ipv6   => 1,
        http   => 'rate_ctl_dimension userid $cookie_uid;',
        server => limited_server(
            'location /b451/ { rate_ctl_blacklist_status 451; empty_gif; }',
            'location /dry/ { rate_ctl_dry_run on; empty_gif; }'));
    publish($n->shm, <<'T');
blacklist ip ::1
blacklist userid u666
blacklist userid u777 ttl_ms=1000
strategy id=1 algorithm=fixed_window rate=1 per=day action=dry_run when api=/drystrategy
strategy id=2 algorithm=fixed_window rate=1 per=day when api=/dry/x
T
    $n->start;

    is($n->get($n->url6('/x'))->{code}, 403, 'IPv6 ::1 blacklisted → 403');
    is($n->get('/x')->{code}, 200, 'IPv4 127.0.0.1 not blacklisted → 200');
    is($n->get('/x', '-b uid=u666')->{code}, 403, 'userid u666 blacklisted → 403');
    is($n->get('/b451/x', '-b uid=u666')->{code}, 451, 'rate_ctl_blacklist_status 451');
    is($n->get('/x', '-b uid=u777')->{code}, 403, 'expiring entry active → 403');
    sleep 1.3;
    is($n->get('/x', '-b uid=u777')->{code}, 200, 'expired entry → 200');
    ok((grep {/^403 BLACKLISTED - \/x$/} $n->access_log), '$rate_ctl_status BLACKLISTED');

    publish($n->shm, "blacklist ip 127.0.0.1\n", 2);
    sleep 0.2;
    is($n->get('/x')->{code}, 403, 'IPv4 127.0.0.1 blacklisted after a publish → 403');
    is($n->get($n->url6('/x'))->{code}, 200, 'IPv6 no longer blacklisted → 200');

    publish($n->shm, <<'T', 3);
strategy id=1 algorithm=fixed_window rate=1 per=day action=dry_run when api=/drystrategy
strategy id=2 algorithm=fixed_window rate=1 per=day when api=/dry/x
T
    sleep 0.2;
    is_deeply([$n->codes('/drystrategy', 4)], [(200) x 4], 'dry-run strategy: all 200');
    is_deeply([$n->codes('/dry/x', 4)], [(200) x 4], 'rate_ctl_dry_run location: all 200');
    my @log = $n->access_log;
    is(scalar(grep {m{^200 DRY_RUN_REJECTED 1 /drystrategy$}} @log), 3, 'strategy dry run logged DRY_RUN_REJECTED 3 times');
    is(scalar(grep {m{^200 DRY_RUN_REJECTED 2 /dry/x$}} @log), 3, 'location dry run logged DRY_RUN_REJECTED 3 times');
    like($n->error_log, qr/would reject request \(dry run\) by strategy 1/, 'dry run rejection logged');
    $n->stop;
    $n->no_alerts;
});

done_testing;
