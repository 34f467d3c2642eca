# The penalty box (issue 32) through two hosts: two nginx instances, each
# with its own file and its own `rate-ctl agent` (host ids a and b) on one
# SQLite store; clients told apart by realip (X-Forwarded-For from
# 127.0.0.1). The issue's bar:
#   --match api=/b --each ip --algorithm fixed_window --rate 2 --per day
#   --scope host --ban-after 3 --ban-within 10s --ban-for 30s:
#   client X gets 200 200 503 503 503 on host a, then 403 on another path
#   of host a at once, and 403 on host b within 2 s; client Y is banned on
#   neither; `rate-ctl blacklist list` shows X with the strategy's name
#   (source ban); `rate-ctl blacklist rm ID` lets X in on both hosts
#   within 2 s (the agent lifts host a's local ban too).
# Item 6: a dry-run strategy with a penalty box logs "would ban" and bans
# nobody; a client an allow strategy lets through is never banned.
# Host a runs the first target of RATE_CTL_TARGETS, host b the last (with
# both builds: vendored 1.28 and Debian 1.22 in one fleet), then the other
# way round; in the second round host a's agent reaches the store through
# `rate-ctl serve` with an agent token bound to host a (its bans go
# through `POST /api/v1/hosts/a/bans`).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $bin = rate_ctl_bin();
my @targets = targets();
my @pairs = @targets > 1 ? ([@targets[0, -1]], [@targets[-1, 0]]) : ([@targets[0, 0]]);

# X-Forwarded-For of a client.
sub as { "-H 'X-Forwarded-For: $_[0]'" }

# One nginx of the fleet on its agent's file.
sub host {
    my ($t, $shm) = @_;
    my $n = RateCtlTest->new($t, workers => 2, shm => $shm, main => workers_main(),
        server => q{
            set_real_ip_from 127.0.0.1;
            real_ip_header X-Forwarded-For;
            rate_ctl on;
            location / { empty_gif; }
        });
    return $n->start;
}

for my $round (0 .. $#pairs) {
    my ($ta, $tb) = @{ $pairs[$round] };
    my $via_serve = $round == 1;
    my $how = $via_serve ? ' (agent a through serve)' : '';
    subtest "host a $ta->{name}, host b $tb->{name}$how" => sub {
        RateCtlTest::window_ahead(86_400, 60);
        my $dir = tempdir('rate_ctl_i32ban_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
        chmod 0755, $dir;
        my $store = "sqlite:$dir/store.db";
        my $out = `$bin strategy add --store $store --name api-b-box --match api=/b --each ip --algorithm fixed_window --rate 2 --per day --scope host --ban-after 3 --ban-within 10s --ban-for 30s 2>&1`;
        is($?, 0, 'strategy add with --ban-after 3 --ban-within 10s --ban-for 30s') or diag $out;
        my $bad = `$bin strategy add --store $store --name bad --match api=/x --algorithm fixed_window --rate 2 --per day --ban-after 3 --ban-within 10s --ban-for 30s 2>&1`;
        like($bad, qr/--ban-after.*each ip or each userid/, 'a penalty box without each ip/userid: refused, the flag named');

        # Issue 32 item 6: a dry run logs "would ban" and bans nobody; an
        # allowed client is never banned.
        $out = `$bin strategy add --store $store --name dry-box --match api=/d --each ip --algorithm fixed_window --rate 1 --per day --scope host --action dry_run --ban-after 2 --ban-within 10s --ban-for 30s 2>&1`;
        is($?, 0, 'a dry-run strategy with a penalty box') or diag $out;
        $out = `$bin strategy add --store $store --name vip --match ip=203.0.113.7 --action allow --priority 10 2>&1`;
        is($?, 0, 'an allow strategy for one client') or diag $out;

        my %n;
        my %via = (a => ['--store', $store], b => ['--store', $store]);
        if ($via_serve) {
            spawn('serve', "$dir/serve.log", $bin, 'serve', '--store', $store, '--listen', '127.0.0.1:0',
                '--admin-token-file', "$dir/admin.token");
            my $addr = wait_until(10, sub { (slurp("$dir/serve.log") =~ m{listening on http://(\S+)\s*$}m)[0] })
                or BAIL_OUT('serve did not start: ' . slurp("$dir/serve.log"));
            my $created = `$bin --store $store token create --role agent --host a --name agent-a 2>&1`;
            my ($token) = $created =~ /(\S+)\s*\z/;
            ok($token && $? == 0, 'an agent token bound to host a') or diag $created;
            $via{a} = ['--store', "http://$addr", '--token', $token];
        }
        for my $h (qw(a b)) {
            spawn("agent $h", "$dir/agent-$h.log", $bin, 'agent', @{ $via{$h} }, '--shm', "$dir/shm-$h",
                '--host-id', $h, '--max-strategies', 64, '--segment-bytes', 65536, '--blacklist-entries', 64,
                '--keys', 1024, '--poll-ms', 50, agent_access());
        }
        for my $h (qw(a b)) {
            wait_until(10, sub { slurp("$dir/agent-$h.log") =~ /published/ })
                or diag slurp("$dir/agent-$h.log");
        }
        $n{a} = host($ta, "$dir/shm-a");
        $n{b} = host($tb, "$dir/shm-b");
        my ($x, $y) = ('192.0.2.10', '198.51.100.20');

        is(join(' ', $n{a}->codes('/b', 5, as($x))), '200 200 503 503 503',
            'client X on host a: 200 200 503 503 503 (the third rejection bans)');
        is($n{a}->get('/other', as($x))->{code}, 403, 'X on another path of host a at once: 403');
        my $t0 = time;
        my $b403 = wait_until(2, sub { $n{b}->get('/other', as($x))->{code} == 403 });
        ok($b403, sprintf('X on host b: 403 within 2 s (%.2f s)', time - $t0));
        is($n{a}->get('/other', as($y))->{code}, 200, 'client Y on host a: 200');
        is($n{b}->get('/other', as($y))->{code}, 200, 'client Y on host b: 200');
        is(join(' ', $n{b}->codes('/b', 2, as($y))), '200 200', 'Y limited only by its own count on host b');

        my ($d, $z) = ('192.0.2.30', '203.0.113.7');
        is(join(' ', $n{a}->codes('/d', 4, as($d))), '200 200 200 200', 'dry run: D passes');
        is(join(' ', $n{a}->codes('/b', 6, as($z))), '200 200 200 200 200 200', 'allowed Z passes /b');
        sleep 0.3;
        is($n{a}->get('/other', as($d))->{code}, 200, 'dry run: D is banned nowhere (host a)');
        is($n{b}->get('/other', as($z))->{code}, 200, 'allowed Z is banned nowhere (host b)');
        like(slurp($n{a}->dir . '/logs/error.log'), qr/would ban ip=192\.0\.2\.30 after 2 rejections \(dry run: nobody is banned\)/,
            'dry run: "would ban" logged');

        my $list = `$bin blacklist list --store $store 2>&1`;
        unlike($list, qr/192\.0\.2\.30|203\.0\.113\.7/, 'neither D nor Z in the blacklist');
        my ($line) = grep {/\Q$x\E/} split /\n/, $list;
        ok($line, 'blacklist list shows X') or diag $list;
        like($line // '', qr/\bban\b.*api-b-box/, 'with source ban and the strategy name');
        like($line // '', qr/3 rejections within 10s on host a/, 'the count, window and host');
        is(scalar(grep {/\Q$x\E/} split /\n/, $list), 1, 'one entry');
        like(slurp($n{a}->dir . '/logs/error.log'), qr/strategy \d+: banned ip=192\.0\.2\.10 on this host after 3 rejections/,
            'host a logged the ban');

        my $inspect = `$bin shm inspect $dir/shm-a 2>&1`;
        like($inspect, qr/ban table: +1 of 4096 rows banned, 1 bans raised, 0 rejections not counted.*, 1 would-bans/,
            'shm inspect: the ban table of host a') or diag $inspect;
        my ($id) = ($line // '') =~ /^\s*(\d+)/;
        $out = `$bin blacklist rm --store $store $id 2>&1`;
        is($?, 0, "blacklist rm $id") or diag $out;
        $t0 = time;
        my $free = wait_until(2, sub {
            $n{a}->get('/other', as($x))->{code} == 200 && $n{b}->get('/other', as($x))->{code} == 200
        });
        ok($free, sprintf('X lets in on both hosts within 2 s of the removal (%.2f s)', time - $t0))
            or diag slurp("$dir/agent-a.log");
        is($n{a}->get('/b', as($x))->{code}, 503, 'X on /b of host a: its limit still applies (503)');

        for my $h (qw(a b)) { $n{$h}->stop; $n{$h}->no_alerts; stop_one("agent $h") }
        stop_one('serve') if $via_serve;
    };
}

done_testing;
