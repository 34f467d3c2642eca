# Condition operators and normalised values (issue 30) through the command
# line and real nginx: strategies written by `rate-ctl strategy add` into a
# SQLite store, published by `rate-ctl agent`, enforced by each nginx
# build. Fixed windows of 3 or 2 a day, host scope:
#   api^=/api/v1/ (3/day), api~=/users/*/orders (2/day),
#   userid!=admin AND api=/n (2/day, userid = $arg_u), api=/login (3/day:
#   /login/ and /login;jsessionid=1 are /login), a `decode lowercase last`
#   $arg dimension; a bad pattern refused naming --match; a bad flag
#   stopping `nginx -t` naming the directive.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $bin = rate_ctl_bin();

# cli(ARGS...): runs rate-ctl; (exit code, stdout and stderr).
sub cli {
    my @args = map { my $a = $_; $a =~ s/'/'\\''/g; "'$a'" } @_;
    my $out = `$bin @args 2>&1`;
    return ($? >> 8, $out);
}

sub add {
    my ($store, $name, $rate, @match) = @_;
    my ($rc, $out) = cli('strategy', 'add', '--store', $store, '--name', $name, '--algorithm', 'fixed_window',
        '--rate', $rate, '--per', 'day', '--scope', 'host', map { ('--match', $_) } @match);
    is($rc, 0, "strategy add $name (@match)") or diag $out;
}

for_each_target(sub {
    my ($t) = @_;
    my $dir = tempdir('rate_ctl_i30_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
    chmod 0755, $dir;
    my $store = "sqlite:$dir/rate-ctl.db";
    my $shm   = "$dir/shm";

    add($store, 'v1',     3, 'api^=/api/v1/');
    add($store, 'orders', 2, 'api~=/users/*/orders');
    add($store, 'n',      2, 'userid!=admin', 'api=/n');
    add($store, 'login',  3, 'api=/login');
    add($store, 'who',    1, 'who=admin', 'api=/w');
    my ($rc, $out) = cli('strategy', 'add', '--store', $store, '--name', 'bad', '--algorithm', 'fixed_window',
        '--rate', 2, '--per', 'day', '--match', 'api^=');
    isnt($rc, 0, "$t->{name}: api^= refused");
    like($out, qr/--match/, "$t->{name}: the refusal names --match");
    my ($rc2, $list) = cli('strategy', 'list', '--store', $store);
    unlike($list, qr/\bbad\b/, "$t->{name}: nothing written for the bad pattern");

    spawn("agent $t->{name}", "$dir/agent.log", $bin, 'agent', '--store', $store, '--shm', $shm,
        '--host-id', 'i30', '--max-strategies', 1024, '--segment-bytes', 262144, '--blacklist-entries', 256,
        '--keys', 4096, agent_access());
    wait_until(15, sub { -s $shm });
    ok(-s $shm, "$t->{name}: the agent published") or diag slurp("$dir/agent.log");

    my $n = RateCtlTest->new($t, shm => $shm, main => workers_main(),
        http => q{
            rate_ctl_dimension userid $arg_u;
            rate_ctl_dimension who $arg_w decode lowercase last;
        },
        server => limited_server());
    $n->start;
    # Wait until the table is enforced (the agent's first publish).
    wait_until(15, sub { $n->error_log =~ /enforcing/ });

    RateCtlTest::window_ahead(86400, 120);
    my @c = map { $n->get($_)->{code} } qw(/api/v1/a /api/v1/b/c /api/v1/x /api/v1/y /api/v2/a);
    is_deeply(\@c, [200, 200, 200, 503, 200], "$t->{name}: api^=/api/v1/ 3/day, /api/v2/a not matched");

    @c = map { $n->get($_)->{code} } qw(/users/1/orders /users/2/orders /users/3/orders /users/1/2/orders /users/1/orders/9);
    is_deeply(\@c, [200, 200, 503, 200, 200],
        "$t->{name}: api~=/users/*/orders 2/day; deeper paths not matched");

    @c = map { $n->get($_)->{code} } ('/n?u=admin', '/n?u=admin', '/n?u=admin', '/n?u=bob', '/n?u=carol',
        '/n?u=bob', '/n', '/n?u=admin');
    is_deeply(\@c, [200, 200, 200, 200, 200, 503, 503, 200],
        "$t->{name}: userid!=admin: admin never limited, bob and carol pass, then bob and no u are limited");

    @c = map { $n->get($_)->{code} } ('/login', '/login/', '/login;jsessionid=1', '/login/', '//login', '/login;x=1/');
    is_deeply(\@c, [200, 200, 200, 503, 503, 503],
        "$t->{name}: api=/login also counts /login/, /login;jsessionid=1 (path normalised)");

    # `decode lowercase last`: a%64MIN is admin, and the last w wins.
    @c = map { $n->get($_)->{code} } ('/w?w=x', '/w?w=a%64MIN', '/w?w=admin&w=x', '/w?w=x&w=ADMIN');
    is_deeply(\@c, [200, 200, 200, 503], "$t->{name}: who decoded, lowercased, the last w wins");

    # A bad flag stops nginx -t, naming the directive.
    my $bad = RateCtlTest->new($t, http => q{ rate_ctl_dimension userid $arg_u upper; });
    my ($trc, $tout) = $bad->test_conf;
    isnt($trc, 0, "$t->{name}: a bad flag fails nginx -t");
    like($tout, qr/invalid flag "upper" for dimension "userid" in "rate_ctl_dimension" directive/,
        "$t->{name}: the error names the flag and the directive");
    my $bad2 = RateCtlTest->new($t, http => q{ rate_ctl_dimension userid $http_x_u last; });
    ($trc, $tout) = $bad2->test_conf;
    like($tout, qr/"last" .* needs the value to be one \$arg_NAME variable/, "$t->{name}: last needs \$arg_NAME");

    # `rate_ctl_dimension api $uri;` gives the raw bytes back.
    my $raw = RateCtlTest->new($t, shm => $shm,
        http => q{ rate_ctl_dimension api $uri; },
        server => limited_server());
    $raw->start;
    wait_until(15, sub { $raw->error_log =~ /enforcing/ });
    is($raw->get('/login/x/')->{code}, 200, "$t->{name}: raw api: /login/x/ is not /login");
    is($raw->get('/login')->{code}, 503, "$t->{name}: raw api: /login still limited (the shared count)");
    $raw->no_alerts;
    $raw->stop;

    $n->no_alerts;
    $n->stop;
    stop_one("agent $t->{name}");
});

done_testing;
