# Limits that look at the response and at cost (issue 31) through real
# nginx proxying to an upstream server block of the same nginx, strategies
# added with the CLI (`rate-ctl strategy add`, SQLite store) and published
# by `rate-ctl agent`; fixed_window, --per day, --scope host:
#   --count-if status=401 --each ip --rate 3 on /login: six logins the
#     upstream answers 200 all pass, three 401s pass through as 401, the
#     next login (the upstream would say 200) gets 503;
#   --cost-from cost --rate 10 on /gql with X-Cost: 4: 200, 200, 503; a
#     cost that is not an integer counts 1 and is logged;
#   --cost-after upcost --rate 10 on /up, the upstream answering X-Cost: 6
#     (`rate_ctl_dimension upcost $upstream_http_x_cost;`): 200, 200, 503.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $bin = rate_ctl_bin();

# A strategy through the CLI; dies with its output if refused.
sub cli_add {
    my ($store, @args) = @_;
    my $out = `$bin strategy add --store $store --algorithm fixed_window --per day --scope host @args 2>&1`;
    die "strategy add @args: $out" if $?;
    return $out;
}

for_each_target(sub {
    my ($t) = @_;
    # A day window must not end in the middle of the test (UTC midnight).
    RateCtlTest::window_ahead(86_400, 60);
    my $dir = tempdir('rate_ctl_i31_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
    chmod 0755, $dir;
    my $store = "sqlite:$dir/store.db";
    cli_add($store, '--name login --match api=/login --each ip --count-if status=401 --rate 3');
    cli_add($store, '--name gql --match api=/gql --cost-from cost --rate 10');
    cli_add($store, '--name up --match api=/up --cost-after upcost --rate 10');
    cli_add($store, '--name gqlk --match api=/gqlk --each ip --cost-from cost --rate 10');
    cli_add($store, '--name elogin --match api=/elogin --each ip --count-if status=401 --rate 2');
    my $list = `$bin strategy list --store $store --json 2>&1`;
    like($list, qr/"count_if":"401"/, 'the store keeps count_if (canonical: no status=)');
    like($list, qr/"cost_after":"upcost"/, 'and cost_after');

    my $shm = "$dir/shm";
    spawn("agent $t->{name}", "$dir/agent.log", $bin, 'agent', '--store', $store, '--shm', $shm,
        '--host-id', 'i31', '--max-strategies', 64, '--segment-bytes', 65536, '--blacklist-entries', 64,
        '--keys', 1024, '--poll-ms', 50, agent_access());
    wait_until(10, sub { -s $shm && slurp("$dir/agent.log") =~ /publish/i });
    ok(-s $shm, 'the agent made the file') or diag slurp("$dir/agent.log");

    my $up = RateCtlTest::free_port('127.0.0.1');
    my $n = RateCtlTest->new($t, workers => 1, shm => $shm, main => workers_main(),
        http => qq{
            rate_ctl_dimension cost \$http_x_cost;
            rate_ctl_dimension upcost \$upstream_http_x_cost;
            server {
                listen 127.0.0.1:$up;
                location /login { if (\$arg_fail) { return 401; } return 200 "ok\\n"; }
                location /elogin { return 401; }
                location /gql { return 200 "ok\\n"; }
                location /gql2 { return 200 "ok\\n"; }
                location /gqlk { return 200 "ok\\n"; }
                location /up { add_header X-Cost 6; return 200 "ok\\n"; }
            }
        },
        server => qq{
            rate_ctl on;
            location / { proxy_pass http://127.0.0.1:$up; }
            # A failed login answered by an error page (an internal
            # redirect, which clears nginx's request contexts).
            location /elogin {
                proxy_pass http://127.0.0.1:$up;
                proxy_intercept_errors on;
                error_page 401 /denied;
            }
            location = /denied { internal; return 200 "denied\\n"; }
            location = /rate_ctl { rate_ctl off; rate_ctl_stats; }
        });
    $n->start;
    # The worker has the table once a strategy rejects; wait for the
    # agent's first publish to reach it (a fresh strategy admits).
    sleep 0.3;

    my @codes = map { $n->get('/login')->{code} } 1 .. 6;
    is("@codes", '200 200 200 200 200 200', 'count_if 401: six logins answered 200 all pass');
    @codes = map { $n->get('/login?fail=1')->{code} } 1 .. 3;
    is("@codes", '401 401 401', 'three failed logins pass through as 401');
    is($n->get('/login')->{code}, 503, 'the next login (the upstream would say 200) is refused');

    # Issue 31: checked at PREACCESS, charged when the request ends. A 401
    # served by an error_page (internal redirect) is still charged: the
    # pool cleanup settles what the LOG phase could not find.
    @codes = map { $n->get('/elogin')->{code} } 1 .. 3;
    is("@codes", '401 401 503', 'count_if through error_page: two 401s charged, the third refused');

    @codes = map { $n->get('/gql', '-H', "'X-Cost: 4'")->{code} } 1 .. 3;
    is("@codes", '200 200 503', 'cost_from 4 of 10: 200, 200, 503');
    @codes = (map({ $n->get('/gqlk', '-H', "'X-Cost: 4'")->{code} } 1 .. 3), $n->get('/gqlk', '-H', "'X-Cost: 2'")->{code});
    is("@codes", '200 200 503 200', 'per key (each ip): 4, 4, then 4 does not fit whole, 2 does');

    my $r = $n->get('/up');
    is($r->{code}, 200, 'cost_after: first request passes');
    is($r->{headers}{'x-cost'}, 6, 'the upstream reports a cost of 6');
    @codes = map { $n->get('/up')->{code} } 1 .. 2;
    is("@codes", '200 503', 'cost_after 6 of 10: 200, 200, 503 (charged 1 up front, 5 after)');

    # The response counters: per strategy at the stats endpoint and in
    # `rate-ctl shm inspect`.
    my $stats = $n->get('/rate_ctl')->{body};
    like($stats, qr/"response":\{"charged_after":3,"given_back":0,"not_counted":6\}/,
        'stats: six logins not counted (nothing to give back: only checked), three 401s charged after');
    like($stats, qr/"response":\{"charged_after":10,"given_back":0,"not_counted":0\}/,
        'stats: 5 units charged after each of the two /up responses');
    my $inspect = `$bin shm inspect $shm --json 2>&1`;
    like($inspect, qr/"count_if": "401"/, 'shm inspect shows count_if');
    like($inspect, qr/"not_counted": 6/, 'and the requests not counted');
    my $prom = $n->get('/rate_ctl?format=prometheus')->{body};
    like($prom, qr/rate_ctl_not_counted_total\{strategy="\d+",name="login"\} 6/, 'Prometheus: rate_ctl_not_counted_total')
        or diag substr($prom, 0, 300);

    # A cost that is not an integer counts 1 and is logged (once a minute).
    my $fresh = `$bin strategy add --store $store --algorithm fixed_window --per day --scope host --name gql2 --match api=/gql2 --cost-from cost --rate 2 2>&1`;
    sleep 0.5;
    @codes = map { $n->get('/gql2', '-H', "'X-Cost: 4x'")->{code} } 1 .. 3;
    is("@codes", '200 200 503', 'an invalid cost counts 1');
    my @bad = $n->error_log =~ /the cost_from dimension's value is not an integer/g;
    is(scalar @bad, 1, 'logged once');

    $n->stop;
    stop_one("agent $t->{name}");
    like($n->error_log, qr/rate_ctl: rejecting request by strategy/, 'rejections are logged');
    $n->no_alerts;
});

done_testing;
