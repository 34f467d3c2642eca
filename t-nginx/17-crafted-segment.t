# Checksum-valid hostile segments published into a running nginx (issue 28):
# a header announcing 2^32-1 strategies (which made every worker abort),
# a record 4 GiB long, 2^32-1 blacklist dimensions. Each is refused with
# one error line naming what is wrong; the previous table is kept; every
# request is answered; no worker dies, neither the running ones nor those
# a reload starts on the hostile segment.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use RateCtlTest;

my %names = (
    'count'                => qr/strategy count 4294967295 does not fit its \d+-byte payload/,
    'record-length'        => qr/record 0: bad record length/,
    'blacklist-dimensions' => qr/blacklist dimension count 4294967295 does not fit/,
);

sub lines_matching {
    my ($n, $re) = @_;
    return grep { /$re/ } split /\n/, $n->error_log;
}

for_each_target(sub {
    my ($t) = @_;
    # One worker: "one line" is then one line in the log.
    my $n = RateCtlTest->new($t, workers => 1,
        server => q{ rate_ctl on; location / { empty_gif; } });
    my $version = 0;
    my $table = sub { "strategy id=$_[0] algorithm=fixed_window rate=1 per=day when api=/a$_[0]\n" };
    publish($n->shm, $table->(1), 1);
    $n->start;
    # `count` last: the reload below starts workers on it (the abort at start).
    for my $kind ('blacklist-dimensions', 'record-length', 'count') {
        $version++;
        publish($n->shm, $table->($version), $version) if $version > 1;
        is_deeply([$n->codes("/a$version", 2)], [200, 503], "$kind: table $version enforced");

        my $out = `@{[RateCtlTest::tool()]} craft @{[$n->shm]} $kind 2>&1`;
        is($?, 0, "$kind: crafted segment announced") or diag $out;
        my ($seq) = $out =~ /seq (\d+)/;
        sleep 0.3;
        my @codes = $n->codes('/b', 30);
        is(RateCtlTest::count_of(200, @codes), 30, "$kind: 30 of 30 requests answered (fail open)") or diag "@codes";
        is_deeply([$n->codes("/a$version", 3)], [503, 503, 503], "$kind: the previous table is kept");
        my @refused = lines_matching($n, qr/\[error\].*refused segment of sequence $seq: .*keeping the previous table/);
        is(scalar @refused, 1, "$kind: one error line for the refusal") or diag $n->error_log;
        like($refused[0] // '', $names{$kind}, "$kind: the line names what is wrong");
    }

    # Workers started on the hostile segment (a reload; a respawn after a
    # crash did the same) load it at start: refused, requests pass.
    $n->reload;
    sleep 0.3;
    my @codes = $n->codes('/b', 30);
    is(RateCtlTest::count_of(200, @codes), 30, 'new workers on the crafted segment: 30 of 30 answered') or diag "@codes";
    ok(scalar(lines_matching($n, qr/refused segment .*requests pass/)) >= 1, 'new workers log the refusal');

    unlike($n->error_log, qr/exited on signal/, 'no worker died');
    $n->stop;
    $n->no_alerts;
});

done_testing;
