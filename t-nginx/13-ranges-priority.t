# Address ranges, allow and priorities (issue 14): many clients through
# realip (X-Forwarded-For from 127.0.0.1), one nginx per build. With
# per-key strategies (issue 13): a range narrows one (each /24 inside
# 10/8), allow and priority apply to them alike, an allowed request takes
# no key (stats keys.in_use).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use RateCtlTest;

sub stats {
    my ($n) = @_;
    my $j = eval { decode_json($n->get('/stats')->{body}) } or return {};
    return { map { $_->{id} => $_ } @{ $j->{strategies} } };
}

# $n requests for $path from client address $ip (more curl args after).
sub from {
    my ($n, $ip, $path, $count, @args) = @_;
    return $n->codes($path, $count, "-H 'X-Forwarded-For: $ip'", @args);
}

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        http   => 'rate_ctl_dimension userid $cookie_uid;',
        server => many_clients_server());
    publish($n->shm, <<'T');
# One limit for the whole 10.0.0.0/8 network (3 a day in total), and a
# narrower length in use besides (one probe per length).
strategy id=1 algorithm=fixed_window rate=3 per=day when ip=10.0.0.0/8 api=/range
strategy id=8 algorithm=fixed_window rate=1 per=day when ip=10.1.0.0/16 api=/range16
strategy id=9 algorithm=fixed_window rate=1 per=day when ip=2001:db8::/32 api=/range
# Everyone 2 a day on /all, except the office network (allow, priority 0).
strategy id=3 algorithm=fixed_window rate=2 per=day when api=/all
strategy id=2 rate=1 action=allow when ip=198.51.100.0/24
# /vip: 1 a day for everyone at priority 0; the VIP gets 5 at priority 10.
strategy id=4 algorithm=fixed_window rate=1 per=day when api=/vip
strategy id=5 algorithm=fixed_window rate=5 per=day priority=10 when userid=vip api=/vip
# /eq: two limits at the same priority both apply.
strategy id=6 algorithm=fixed_window rate=3 per=day when api=/eq
strategy id=7 algorithm=fixed_window rate=2 per=day when userid=u7 api=/eq
# Per-key (issue 13) beside ranges, allow and priority: inside 10/8 each
# /24 gets 2 a day on /net, outside nothing limits.
strategy id=20 algorithm=fixed_window rate=2 per=day each=ip ipv4_prefix=24 when ip=10.0.0.0/8 api=/net
# /pk: every client 1 a day (each ip), except the monitoring range (allow,
# priority 10), and VIP clients 3 a day each (priority 10).
strategy id=21 algorithm=fixed_window rate=1 per=day each=ip when api=/pk
strategy id=22 rate=1 action=allow priority=10 when ip=198.18.0.0/15
strategy id=23 algorithm=fixed_window rate=3 per=day priority=10 each=ip when userid=vip2 api=/pk
# /both: a per-key and a shared limit at the same priority both apply.
strategy id=24 algorithm=fixed_window rate=2 per=day each=ip when api=/both
strategy id=25 algorithm=fixed_window rate=3 per=day when api=/both
blacklist ip 192.0.2.0/24 ttl_ms=6000
blacklist ip 198.51.100.66
T
    my $t0 = time;
    $n->start;
    my $name = $t->{name};

    # A range strategy limits every address inside, together, and none outside.
    my @in = map { (from($n, $_, '/range', 1))[0] } qw(10.1.1.1 10.200.0.9 10.0.0.1 10.3.3.3 10.255.255.255 10.77.0.1);
    is_deeply(\@in, [200, 200, 200, 503, 503, 503], "$name: 10.0.0.0/8 shares 3 a day among its addresses");
    for my $ip (qw(11.0.0.1 9.255.255.255 127.0.0.1 172.16.0.1)) {
        is_deeply([from($n, $ip, '/range', 4)], [(200) x 4], "$name: $ip outside 10.0.0.0/8 is not limited");
    }
    is_deeply([from($n, '10.1.2.3', '/range16', 2)], [200, 503], "$name: 10.1.0.0/16 on its own path");
    is_deeply([from($n, '10.2.2.3', '/range16', 2)], [200, 200], "$name: 10.2.2.3 is outside 10.1.0.0/16");
    is_deeply([from($n, '2001:db8:1::5', '/range', 2)], [200, 503], "$name: IPv6 range");
    is_deeply([from($n, '2001:db9::5', '/range', 2)], [200, 200], "$name: outside the IPv6 range");

    # A /24 blacklist entry: 403 inside, 200 outside, and it expires.
    is_deeply([map { (from($n, $_, '/x', 1))[0] } qw(192.0.2.1 192.0.2.254 192.0.3.1 192.0.1.255)],
        [403, 403, 200, 200], "$name: 192.0.2.0/24 blacklisted inside only");
    ok((grep {m{^403 BLACKLISTED - /x$}} $n->access_log), "$name: BLACKLISTED logged");

    # The office passes 100 requests while everyone else is limited; the
    # blacklist beats the allow.
    is_deeply([from($n, '198.51.100.7', '/all', 100)], [(200) x 100], "$name: allowed range passes 100 requests");
    is(scalar(grep {m{^200 ALLOWED 2 /all$}} $n->access_log), 100, "$name: \$rate_ctl_status ALLOWED by strategy 2");
    is_deeply([from($n, '203.0.113.5', '/all', 3)], [200, 200, 503], "$name: everyone else limited to 2");
    is_deeply([from($n, '198.51.100.8', '/all', 3)], [200, 200, 200], "$name: the office still passes");
    is((from($n, '198.51.100.66', '/all', 1))[0], 403, "$name: blacklist beats allow");
    my $s = stats($n);
    is($s->{2}{passed}, 103, "$name: the allow counted the 103 it let through");
    is($s->{3}{passed}, 2, "$name: the limit saw only the others");

    # Priority: the VIP's priority-10 strategy replaces the priority-0 limit.
    is_deeply([from($n, '10.9.0.1', '/vip', 7, '-b uid=vip')], [(200) x 5, 503, 503], "$name: VIP gets 5 (priority 10)");
    is_deeply([from($n, '10.9.0.2', '/vip', 2, '-b uid=joe')], [200, 503], "$name: others get 1 (priority 0)");
    $s = stats($n);
    is($s->{4}{passed}, 1, "$name: the priority-0 limit never counted the VIP");
    is($s->{5}{passed}, 5, "$name: the VIP strategy counted its 5");

    # Equal priorities all apply; a rejected request is counted by none.
    is_deeply([from($n, '10.9.0.3', '/eq', 3, '-b uid=u7')], [200, 200, 503], "$name: u7 limited by strategy 7 (2)");
    $s = stats($n);
    is($s->{6}{passed}, 2, "$name: strategy 6 did not count the request 7 rejected");
    is($s->{7}{limited}, 1, "$name: strategy 7 limited 1");
    is_deeply([from($n, '10.9.0.4', '/eq', 2)], [200, 503], "$name: strategy 6 has 1 left (3)");

    # A range narrows a per-key strategy: each /24 inside 10/8 has its own
    # 2, addresses outside are not limited by it.
    is_deeply([from($n, '10.5.1.1', '/net', 3)], [200, 200, 503], "$name: 10.5.1.0/24 gets 2");
    is_deeply([from($n, '10.5.1.200', '/net', 1)], [503], "$name: the same /24 shares them");
    is_deeply([from($n, '10.5.2.1', '/net', 3)], [200, 200, 503], "$name: the next /24 its own 2");
    is_deeply([from($n, '11.5.1.1', '/net', 5)], [(200) x 5], "$name: outside 10/8 not limited per key");
    $s = stats($n);
    is($s->{20}{keys}{in_use}, 2, "$name: two /24 keys, none for the outside client");
    is($s->{20}{passed}, 4, "$name: the per-key range strategy counted 4");

    # allow at priority 10 exempts its range from a per-key limit at 0, and
    # never takes a key.
    is_deeply([from($n, '198.18.0.5', '/pk', 100)], [(200) x 100], "$name: monitoring passes 100 on /pk");
    $s = stats($n);
    is($s->{21}{keys}{in_use}, 0, "$name: 100 allowed requests took no key");
    is($s->{22}{passed}, 100, "$name: the allow counted them");
    is_deeply([from($n, '203.0.113.9', '/pk', 2)], [200, 503], "$name: any other client 1 a day on /pk");
    is_deeply([from($n, '203.0.113.10', '/pk', 2)], [200, 503], "$name: ... per client");
    # A per-key VIP strategy at priority 10 replaces the per-key limit at 0.
    is_deeply([from($n, '10.9.9.1', '/pk', 4, '-b uid=vip2')], [200, 200, 200, 503], "$name: a VIP client 3 a day");
    is_deeply([from($n, '10.9.9.2', '/pk', 4, '-b uid=vip2')], [200, 200, 200, 503], "$name: another VIP client its own 3");
    $s = stats($n);
    is($s->{21}{keys}{in_use}, 2, "$name: the priority-0 limit keyed only the two others");
    is($s->{21}{passed}, 2, "$name: ... and counted only them");
    is($s->{23}{keys}{in_use}, 2, "$name: the VIP strategy keyed its two clients");
    is($s->{23}{passed}, 6, "$name: ... and counted their 6");

    # Equal priorities: the per-key limit (2 each) and the shared one (3 in
    # all) both apply; a rejected request is counted by neither.
    is_deeply([from($n, '10.20.0.1', '/both', 3)], [200, 200, 503], "$name: per-key 2 for the first client");
    is_deeply([from($n, '10.20.0.2', '/both', 2)], [200, 503], "$name: the shared 3 ends the second client");
    $s = stats($n);
    is($s->{24}{passed}, 3, "$name: the per-key strategy counted the 3 passed");
    is($s->{25}{passed}, 3, "$name: so did the shared one");
    is($s->{24}{limited} + $s->{25}{limited}, 2, "$name: each rejection counted once");

    # The blacklist range expires.
    my $left = $t0 + 6.3 - time;
    sleep $left if $left > 0;
    is((from($n, '192.0.2.1', '/x', 1))[0], 200, "$name: the /24 entry expired");
    $n->stop;
    $n->no_alerts;
});

done_testing;
