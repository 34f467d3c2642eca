# Calendar windows (issue 33): fixed windows added with the CLI
# (`rate-ctl strategy add --per month|week --tz AREA/CITY`, SQLite store),
# published by `rate-ctl agent`, and nginx with `rate_ctl_headers on`:
#   --per month --tz Pacific/Auckland --rate 2: 200, 200, 503, and
#     RateLimit-Reset / Retry-After are the seconds until the next Auckland
#     month start (the 1st, 00:00 local), ±5 s, computed here apart from
#     rate_ctl (Perl's POSIX with TZ=Pacific/Auckland);
#   the same per key (--each ip): two clients (realip) each get their 2;
#   --per week --tz Europe/Berlin: the reset is the next Berlin Monday
#     00:00; --per week (UTC): the next Monday 00:00 UTC; --per day --tz
#     Asia/Kathmandu: the next local midnight (UTC+5:45);
#   the CLI refuses an unknown zone naming --tz, a week for token_bucket
#     naming --per, and a zone on an hourly window naming --tz.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp qw(tempdir);
use POSIX qw(mktime);
use Time::HiRes qw(sleep time);
use RateCtlTest;

my $bin = rate_ctl_bin();

sub cli_add {
    my ($store, @args) = @_;
    my $out = `$bin strategy add --store $store --algorithm fixed_window --scope host @args 2>&1`;
    die "strategy add @args: $out" if $?;
    return $out;
}

# Unix time of the next window start after $now in zone $tz: the 1st of
# next month (month) or the next Monday (week), 00:00 local, by the C
# library's zone rules (mktime with isdst -1: DST decided by the date).
sub next_start {
    my ($tz, $unit, $now) = @_;
    local $ENV{TZ} = $tz;
    POSIX::tzset();
    my @lt = localtime($now);
    my $t = $unit eq 'month' ? mktime(0, 0, 0, 1, $lt[4] + 1, $lt[5], 0, 0, -1)
        : $unit eq 'day'     ? mktime(0, 0, 0, $lt[3] + 1, $lt[4], $lt[5], 0, 0, -1)
        :                      mktime(0, 0, 0, $lt[3] + ((8 - $lt[6]) % 7 || 7), $lt[4], $lt[5], 0, 0, -1);
    POSIX::tzset();
    return $t;
}

my $dir0 = tempdir('rate_ctl_i33cal_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
{
    my $store = "sqlite:$dir0/store.db";
    my $out = `$bin strategy add --store $store --algorithm fixed_window --per month --tz Mars/Olympus --rate 2 --name m 2>&1`;
    ok($?, 'an unknown zone is refused');
    like($out, qr/--tz/, 'naming --tz') or diag $out;
    like($out, qr{Mars/Olympus}, 'and the zone');
    $out = `$bin strategy add --store $store --algorithm token_bucket --per week --rate 2 --name w 2>&1`;
    ok($?, 'a week for token_bucket is refused');
    like($out, qr/--per/, 'naming --per') or diag $out;
    $out = `$bin strategy add --store $store --algorithm fixed_window --per hour --tz Europe/Berlin --rate 2 --name h 2>&1`;
    ok($?, 'a zone on an hourly window is refused');
    like($out, qr/--tz/, 'naming --tz') or diag $out;
}

for_each_target(sub {
    my ($t) = @_;
    my $dir = tempdir('rate_ctl_i33cal_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
    chmod 0755, $dir;
    my $store = "sqlite:$dir/store.db";
    cli_add($store, '--name akl --match api=/akl --per month --tz Pacific/Auckland --rate 2');
    cli_add($store, '--name aklk --match api=/aklk --per month --tz Pacific/Auckland --each ip --rate 2');
    cli_add($store, '--name ber --match api=/ber --per week --tz Europe/Berlin --rate 1');
    cli_add($store, '--name utcw --match api=/utcw --per week --rate 1');
    cli_add($store, '--name ktm --match api=/ktm --per day --tz Asia/Kathmandu --rate 1');
    my $list = `$bin strategy list --store $store --json 2>&1`;
    like($list, qr{"tz":"Pacific/Auckland"}, 'the store keeps the zone');
    like($list, qr{"per":"month"}, 'and the month');

    my $shm = "$dir/shm";
    spawn("agent $t->{name}", "$dir/agent.log", $bin, 'agent', '--store', $store, '--shm', $shm,
        '--host-id', 'i33cal', '--max-strategies', 64, '--segment-bytes', 65536, '--blacklist-entries', 64,
        '--keys', 1024, '--poll-ms', 50, agent_access());
    wait_until(10, sub { -s $shm && slurp("$dir/agent.log") =~ /publish/i });
    ok(-s $shm, 'the agent made the file') or diag slurp("$dir/agent.log");

    my $n = RateCtlTest->new($t, workers => 1, shm => $shm, main => workers_main(),
        server => q{
            rate_ctl on;
            rate_ctl_headers on;
            set_real_ip_from 127.0.0.1;
            real_ip_header X-Forwarded-For;
            location / { empty_gif; }
        });
    $n->start;
    sleep 0.3;

    my @r = map { $n->get('/akl') } 1 .. 3;
    my $now = time;
    is(join(' ', map { $_->{code} } @r), '200 200 503', 'month in Auckland: 2 of 3 pass');
    my $want = next_start('Pacific/Auckland', 'month', $now) - $now;
    my $reset = $r[2]{headers}{'ratelimit-reset'} // -1;
    ok(abs($reset - $want) <= 5, "RateLimit-Reset $reset = seconds until the next Auckland month start ($want, ±5 s)");
    my $retry = $r[2]{headers}{'retry-after'} // -1;
    ok(abs($retry - $want) <= 5, "Retry-After $retry likewise");
    is($r[2]{headers}{'ratelimit-remaining'}, 0, 'RateLimit-Remaining 0');
    my $first = $r[0]{headers}{'ratelimit-reset'} // -1;
    ok(abs($first - $want) <= 5, "an admitted request's RateLimit-Reset $first too");
    diag "Auckland now: " . do { local $ENV{TZ} = 'Pacific/Auckland'; POSIX::tzset(); my $s = localtime($now); POSIX::tzset(); $s }
        . ", next month start in $want s";

    # Per key: each client its own 2, the same reset.
    my @a = map { $n->get('/aklk', '-H', "'X-Forwarded-For: 192.0.2.1'") } 1 .. 3;
    my @b = map { $n->get('/aklk', '-H', "'X-Forwarded-For: 192.0.2.2'")->{code} } 1 .. 3;
    is(join(' ', map { $_->{code} } @a), '200 200 503', 'per key: client 1 gets 2');
    is("@b", '200 200 503', 'per key: client 2 gets its own 2');
    $reset = $a[2]{headers}{'ratelimit-reset'} // -1;
    ok(abs($reset - $want) <= 5, "per key: RateLimit-Reset $reset until the Auckland month start ($want)");

    # Weeks: Monday 00:00 in Berlin and in UTC.
    for ([ '/ber', 'Europe/Berlin' ], [ '/utcw', 'UTC' ]) {
        my ($path, $tz) = @$_;
        my @w = map { $n->get($path) } 1 .. 2;
        my $now = time;
        is(join(' ', map { $_->{code} } @w), '200 503', "week ($tz): 1 of 2 passes");
        my $want = next_start($tz, 'week', $now) - $now;
        my $reset = $w[1]{headers}{'ratelimit-reset'} // -1;
        ok(abs($reset - $want) <= 5, "week ($tz): RateLimit-Reset $reset until the next Monday 00:00 ($want)");
    }

    # A day in Kathmandu (UTC+5:45): local midnight.
    {
        my @d = map { $n->get('/ktm') } 1 .. 2;
        my $now = time;
        is(join(' ', map { $_->{code} } @d), '200 503', 'day (Asia/Kathmandu): 1 of 2 passes');
        my $want = next_start('Asia/Kathmandu', 'day', $now) - $now;
        my $reset = $d[1]{headers}{'ratelimit-reset'} // -1;
        ok(abs($reset - $want) <= 5, "day (Asia/Kathmandu): RateLimit-Reset $reset until local midnight ($want)");
    }

    # shm inspect shows the zone.
    my $inspect = `$bin shm inspect $shm --json 2>&1`;
    like($inspect, qr{"tz": "Pacific/Auckland"}, 'shm inspect shows the zone') or diag substr($inspect, 0, 600);

    $n->stop;
    stop_one("agent $t->{name}");
    $n->no_alerts;
});

done_testing;
