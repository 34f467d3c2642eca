# Per-key operations (issue 33) through real nginx, on each build: one
# `rate-ctl serve` (SQLite), one agent through it with a named agent
# token, nginx with realip and `rate_ctl_headers on`, a `--each ip`
# 5/day strategy. Client X after 3 requests: `rate-ctl shm key --json`
# says used 3, remaining 2; the API's fleet view says used 3 within 2 s;
# after X is rejected twice `rate-ctl shm top --json` lists X first; a
# reset through the API (`rate-ctl --api … key reset`) lets X pass again
# within 2 s and is audited. The API's errors name the field.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use HTTP::Tiny;
use JSON::PP qw(decode_json);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $bin    = rate_ctl_bin();
my @access = agent_access();
my $X      = '192.0.2.7';
my $Y      = '198.51.100.9';

sub run_json {
    my (@argv) = @_;
    my $out = `@argv 2>&1`;
    my $v = eval { decode_json($out) };
    diag("@argv: $out") unless $v;
    return $v;
}

for_each_target(sub {
    my ($target) = @_;
    my $t = $target->{name};
    my $dir = tempdir('rate_ctl_i33keys_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
    chmod 0755, $dir;
    my $store = "sqlite:$dir/rate-ctl.db";
    spawn("serve $t", "$dir/serve.log", $bin, 'serve', '--store', $store, '--listen', '127.0.0.1:0',
        '--admin-token-file', "$dir/admin.token", '--freshness', '3s');
    my $addr = wait_until(10, sub { (slurp("$dir/serve.log") =~ m{listening on http://(\S+)\s*$}m)[0] })
        or BAIL_OUT('serve did not start: ' . slurp("$dir/serve.log"));
    my $admin = slurp("$dir/admin.token");
    chomp $admin;
    my $api = "http://$addr";
    my $http = HTTP::Tiny->new(timeout => 5,
        default_headers => { Authorization => "Bearer $admin", 'Content-Type' => 'application/json' });

    my $created = `$bin --store $store token create --role agent --host h0 --name a0 2>&1`;
    my ($agent_token) = $created =~ /(\S+)\s*\z/;
    ok($agent_token && $? == 0, "$t: agent token created") or diag $created;

    my $r = $http->post("$api/api/v1/strategies", { content =>
        '{"name":"perip","algorithm":"fixed_window","rate":5,"per":"day","each":["ip"],"match":{"api":"/k"}}' });
    is($r->{status}, 201, "$t: strategy created") or diag $r->{content};
    my $id = decode_json($r->{content})->{id};

    my $shm = "$dir/h0.shm";
    spawn("agent $t", "$dir/agent.log", $bin, 'agent', '--store', $api, '--token', $agent_token,
        '--shm', $shm, '--host-id', 'h0', '--max-strategies', 64, '--segment-bytes', 65536,
        '--blacklist-entries', 64, '--keys', 4096, '--freshness', '3s', '--max-backoff-ms', 500, @access);
    wait_until(10, sub { `$bin shm inspect $shm --json 2>/dev/null` =~ /"id":\s*$id\b/ })
        or BAIL_OUT("agent did not publish: " . slurp("$dir/agent.log"));

    my $n = RateCtlTest->new($target, workers => 1, shm => $shm, main => workers_main(),
        server => q{
            set_real_ip_from 127.0.0.1;
            real_ip_header X-Forwarded-For;
            rate_ctl on;
            rate_ctl_headers on;
            location / { empty_gif; }
        });
    $n->start;
    my $codes = sub { my ($ip, $k) = @_; [ $n->codes('/k', $k, "-H 'X-Forwarded-For: $ip'") ] };

    # 1. This host's reading after 3 requests.
    is_deeply($codes->($X, 3), [200, 200, 200], "$t: X passes 3 times");
    is_deeply($codes->($Y, 1), [200], "$t: Y once");
    my $k = run_json($bin, 'shm', 'key', $shm, '--strategy', $id, '--key', $X, '--json');
    is_deeply([@{$k}{qw(key used remaining limit found)}], ["ip=$X", 3, 2, 5, JSON::PP::true],
        "$t: shm key: used 3, remaining 2 of 5");
    ok($k->{reset_ms} > 0 && $k->{reset_ms} <= 86_400_000, "$t: shm key: reset within the day");
    my $bad = `$bin shm key $shm --strategy $id --key not-an-address 2>&1`;
    like($bad, qr/--key: `ip`: not an address/, "$t: shm key names a bad key");
    is($? >> 8, 2, "$t: shm key: a bad key is a usage error");

    # 2. The fleet view within 2 s.
    my $t0 = time;
    $r = $http->get("$api/api/v1/strategies/$id/keys/$X");
    my $took = time - $t0;
    is($r->{status}, 200, "$t: keys/X answered") or diag $r->{content};
    my $v = decode_json($r->{content});
    is($v->{fleet}{used}, 3, "$t: fleet used 3");
    is($v->{fleet}{remaining}, 2, "$t: fleet remaining 2");
    ok($took < 2, sprintf("$t: fleet view in %.2f s (< 2 s)", $took));
    is_deeply([map { [$_->{host}, $_->{answered} ? 1 : 0, $_->{used}] } @{ $v->{hosts} }], [['h0', 1, 3]],
        "$t: host h0 answered used 3");
    my $cli = `$bin --api $api --token $admin key show --strategy $id --key $X 2>&1`;
    like($cli, qr/fleet used 3, remaining 2.*\n  h0: used 3 of 5/, "$t: key show prints the fleet and h0");

    # API errors name the field.
    $r = $http->get("$api/api/v1/strategies/$id/keys/nope");
    is($r->{status}, 422, "$t: bad key 422");
    is(eval { decode_json($r->{content})->{error}{field} }, 'key', "$t: bad key names `key`");
    $r = $http->get("$api/api/v1/strategies/999/keys/$X");
    is($r->{status}, 404, "$t: unknown strategy 404");
    is(eval { decode_json($r->{content})->{error}{field} }, 'strategy', "$t: unknown strategy names `strategy`");

    # 3. X rejected twice.
    is_deeply($codes->($X, 4), [200, 200, 503, 503], "$t: X: 2 more, then rejected twice");

    # Top keys: X first, with its two rejections; the fleet's merge too.
    my $top = run_json($bin, 'shm', 'top', $shm, '--strategy', $id, '--json');
    is($top->{entries}[0]{key}, "ip=$X", "$t: shm top lists X first") or diag explain $top;
    is($top->{entries}[0]{rejections}, 2, "$t: shm top: X rejected twice");
    $r = $http->get("$api/api/v1/strategies/$id/top");
    my $ft = eval { decode_json($r->{content}) } // {};
    is($ft->{entries}[0]{key}, "ip=$X", "$t: API top: X first across the fleet") or diag $r->{content};
    is($ft->{entries}[0]{rejections}, 2, "$t: API top: 2 rejections");
    is_deeply($ft->{entries}[0]{hosts}, ['h0'], "$t: API top: seen on h0");

    # 4. A reset through the API lets X pass again within 2 s.
    my $out = `$bin --api $api --token $admin key reset --strategy $id --key $X 2>&1`;
    is($?, 0, "$t: key reset accepted") or diag $out;
    $t0 = time;
    my $passed = wait_until(3, sub { $codes->($X, 1)->[0] == 200 });
    my $after = time - $t0;
    ok($passed && $after < 2, sprintf("$t: X passes again %.2f s after the reset", $after));
    $k = run_json($bin, 'shm', 'key', $shm, '--strategy', $id, '--key', $X, '--json');
    is($k->{used}, 1, "$t: after the reset X has used 1 (the request that passed)");
    $k = run_json($bin, 'shm', 'key', $shm, '--strategy', $id, '--key', $Y, '--json');
    is($k->{used}, 1, "$t: Y untouched by X's reset");
    like(slurp("$dir/agent.log"), qr/key reset applied.*key=ip=\Q$X\E/, "$t: the agent logged the reset");
    $r = $http->get("$api/api/v1/audit?limit=5");
    like($r->{content}, qr/"action":"key\.reset".*"target":"strategies\/$id\/keys\/ip=\Q$X\E"/,
        "$t: the reset is audited");
    $out = `$bin --api $api --token $admin key reset --strategy $id --key 10.0.0.1/40 2>&1`;
    like($out, qr/invalid --key: .*prefix length/, "$t: key reset names a bad key");

    $n->stop;
    stop_one("agent $t");
    stop_one("serve $t");
    unlike(slurp("$dir/agent.log"), qr/panicked/, "$t: agent did not panic");
});

done_testing;
