# The FFI edge fails open (issue 28): a panic in any of the module's
# entries nginx calls (phase handler, variable getter, pool cleanup,
# init_process, exit_process, stats handler) is caught; the request passes
# (or the entry does nothing more), one [alert] line per worker per minute
# names the entry, its message is escaped, and no worker dies. The test
# knob: `env RATE_CTL_TEST_PANIC=ENTRY;` makes that entry panic.
#
# Also: request bytes reach error.log escaped (`... for key userid=a\x1b...`).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Socket::IP;
use Test::More;
use Time::HiRes qw(sleep);
use RateCtlTest;

sub alerts {
    my ($n, $entry) = @_;
    return grep { /\[alert\].*rate_ctl: internal error \(panic\) in \Q$entry\E: / } split /\n/, $n->error_log;
}

sub no_crash {
    my ($n, $what) = @_;
    my $log = $n->error_log;
    unlike($log, qr/exited on signal/, "$what: no worker died");
    ok(index($log, "\x1b") < 0, "$what: no raw ESC byte in error.log");
}

for_each_target(sub {
    my ($t) = @_;
    my $table = "strategy id=1 algorithm=fixed_window rate=1 per=day when api=/a\n"
        . "strategy id=2 algorithm=concurrency rate=5 action=reject when api=/c\n";
    my %entries = (
        preaccess    => 'the PREACCESS handler',
        variable     => 'a variable getter',
        cleanup      => 'the request cleanup',
        init_process => 'init_process',
        stats        => 'the stats handler',
    );
    for my $knob (sort keys %entries) {
        my $n = RateCtlTest->new($t, workers => 1, main => "env RATE_CTL_TEST_PANIC=$knob;",
            server => q{ rate_ctl on; location / { empty_gif; }
                         location = /stats { rate_ctl off; rate_ctl_stats; } });
        publish($n->shm, $table, 1);
        $n->start;
        my @a = $n->codes('/a', 30);
        my @c = $n->codes('/c', 5);
        my $stats = $n->get('/stats');
        if ($knob eq 'preaccess') {
            is(RateCtlTest::count_of(200, @a), 30, "$knob: 30 of 30 pass (fail open) where 1/day applies") or diag "@a";
        } else {
            is(scalar(grep { $_ == 200 || $_ == 503 } @a), 30, "$knob: 30 of 30 answered") or diag "@a";
            is($a[0], 200, "$knob: the first passes");
            is($a[-1], 503, "$knob: the strategy still applies") unless $knob eq 'preaccess';
        }
        is(RateCtlTest::count_of(200, @c), 5, "$knob: concurrency requests answered");
        if ($knob eq 'stats') {
            is($stats->{code}, 500, 'stats: a panic is a 500, not a dead worker');
        } else {
            is($stats->{code}, 200, "$knob: stats answered");
        }
        if ($knob eq 'variable') {
            # $rate_ctl_status panicked: logged as not found ("-").
            my @lines = grep { m{ /a$} } $n->access_log;
            is(scalar(grep { /^\d+ - / } @lines), 30, 'variable: the panicking variable reads as not found')
                or diag join "\n", @lines[0 .. 2];
        }
        my @alerts = alerts($n, $entries{$knob});
        is(scalar @alerts, 1, "$knob: one alert line") or diag $n->error_log;
        like($alerts[0] // '', qr/RATE_CTL_TEST_PANIC asked \w+ to panic \\x1b\[31m\(test\) at src\/module\//,
            "$knob: the line names the panic, escaped");
        no_crash($n, $knob);
        $n->stop;
    }

    # exit_process: the worker's exit hook panics as nginx stops it.
    my $n = RateCtlTest->new($t, workers => 1, main => 'env RATE_CTL_TEST_PANIC=exit_process;',
        server => q{ rate_ctl on; location / { empty_gif; } });
    publish($n->shm, $table, 1);
    $n->start;
    is(RateCtlTest::count_of(200, $n->codes('/b', 5)), 5, 'exit_process: requests answered');
    $n->reload;
    sleep 0.3;
    is(scalar(alerts($n, 'exit_process')), 1, 'exit_process: one alert line as the old worker exits');
    is(RateCtlTest::count_of(200, $n->codes('/b', 5)), 5, 'exit_process: new worker answers');
    no_crash($n, 'exit_process');
    $n->stop;

    # Request bytes reach error.log escaped: an ESC (and a newline-free
    # forged suffix) in a header value that is a per-key strategy's key.
    $n = RateCtlTest->new($t, workers => 1,
        http => q{ rate_ctl_dimension userid $http_x_user; },
        server => q{ rate_ctl on; location / { empty_gif; } });
    publish($n->shm, "strategy id=7 algorithm=fixed_window rate=1 per=day each=userid when api=/k\n", 1);
    $n->start;
    my @codes;
    for (1 .. 2) {
        my $s = IO::Socket::IP->new(PeerHost => '127.0.0.1', PeerPort => $n->port) or die "connect: $!";
        print $s "GET /k HTTP/1.0\r\nHost: x\r\nX-User: a\x1b[2Jb\xff\r\n\r\n";
        my $line = <$s> // '';
        push @codes, $line =~ m{^HTTP/1\.\d (\d+)} ? $1 : 0;
        close $s;
    }
    is_deeply(\@codes, [200, 503], 'ESC: the header value keys a per-key strategy');
    my $log = $n->error_log;
    like($log, qr/rejecting request by strategy 7 for key userid=a\\x1b\[2Jb\\xff/,
        'ESC: the key is logged with \xNN escapes');
    ok(index($log, "\x1b") < 0, 'ESC: no raw 0x1b byte in error.log');
    $n->stop;
    $n->no_alerts;
});

done_testing;
