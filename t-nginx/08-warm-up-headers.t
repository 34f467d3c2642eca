# warm_up admits a third of its rate when cold and the full rate after the
# warm-up period; rate_ctl_headers on | legacy | draft, each parsed.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use HTTP::Tiny;
use Time::HiRes qw(time);
use RateCtlTest;

# A small parser of the draft's structured fields (RFC 8941 List of Items
# with parameters): returns a list of [name, {param => value}].
sub sf_list {
    my ($s) = @_;
    my @items;
    pos($s) = 0;
    while (1) {
        $s =~ /\G\s*/gc;
        my $name;
        if ($s =~ /\G"((?:[^"\\]|\\.)*)"/gc) { ($name = $1) =~ s/\\(.)/$1/g }
        elsif ($s =~ /\G([A-Za-z*][A-Za-z0-9:\/!#\$%&'*+\-.^_`|~]*)/gc) { $name = $1 }
        else { return undef }
        my %p;
        while ($s =~ /\G;\s*([a-z*][a-z0-9_\-.*]*)/gc) {
            my $k = $1;
            if ($s =~ /\G=(-?\d{1,15})(?![\d.])/gc) { $p{$k} = $1 + 0 }
            elsif ($s =~ /\G="((?:[^"\\]|\\.)*)"/gc) { $p{$k} = $1 }
            elsif ($s =~ /\G=([A-Za-z*][^;,\s]*)/gc) { $p{$k} = $1 }
            elsif ($s =~ /\G=/gc) { return undef }
            else { $p{$k} = 1 }
        }
        push @items, [ $name, \%p ];
        $s =~ /\G\s*/gc;
        last if pos($s) == length $s;
        return undef unless $s =~ /\G,/gc;
    }
    return \@items;
}

# Sends requests back to back on one keep-alive connection for $secs
# seconds; returns the times (since the first request) of the 200s.
sub hammer {
    my ($url, $secs) = @_;
    my $http = HTTP::Tiny->new(keep_alive => 1, timeout => 5);
    my $t0 = time;
    my (@ok, $sent);
    while ((my $t = time - $t0) < $secs) {
        my $r = $http->get($url);
        $sent++;
        push @ok, $t if $r->{status} == 200;
    }
    diag sprintf "%d requests in %.1f s, %d admitted; per 200 ms: %s", $sent, $secs, scalar @ok,
        join ' ', map { my $b = $_; scalar grep { $_ >= $b * 0.2 && $_ < ($b + 1) * 0.2 } @ok } 0 .. int($secs / 0.2) - 1;
    return @ok;
}

# Three requests to /STYLE/x, a limit of 2 a day whose answers carry the
# HEADER-Limit, -Remaining and -Reset fields: the first passes showing
# Limit 2 and Remaining 1 (then $more->(answer) checks what is particular
# to the style), the third is refused with Remaining 0, Reset and
# Retry-After.
sub two_a_day {
    my ($n, $style, $header, $more) = @_;
    my $h = lc $header;
    my $r = $n->get("/$style/x");
    is($r->{code}, 200, "$style: first passes");
    is($r->{headers}{"$h-limit"}, 2, "$style: $header-Limit");
    is($r->{headers}{"$h-remaining"}, 1, "$style: $header-Remaining");
    $more->($r);
    $n->get("/$style/x");
    $r = $n->get("/$style/x");
    is($r->{code}, 503, "$style: third rejected");
    is($r->{headers}{"$h-remaining"}, 0, "$style: Remaining 0 on rejection");
    ok($r->{headers}{"$h-reset"} >= 1, "$style: Reset >= 1 while limited");
    ok($r->{headers}{'retry-after'} >= 1, "$style: Retry-After on rejection");
}

sub between { my ($from, $to, @t) = @_; scalar grep { $_ >= $from && $_ < $to } @t }

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        server => limited_server(
            'location /on/ { rate_ctl_headers on; empty_gif; }',
            'location /legacy/ { rate_ctl_headers legacy; empty_gif; }',
            'location /draft/ { rate_ctl_headers draft; empty_gif; }'));
    publish($n->shm, <<'T');
strategy id=1 algorithm=warm_up rate=100 per=second warm_up_ms=2000 cold_factor=3 when api=/cold
strategy id=2 algorithm=fixed_window rate=2 per=day when api=/on/x
strategy id=3 algorithm=fixed_window rate=2 per=day when api=/legacy/x
strategy id=4 algorithm=fixed_window rate=2 per=day when api=/draft/x
strategy id=5 algorithm=fixed_window rate=5 per=day when api=/draft/two
strategy id=6 algorithm=fixed_window rate=3 per=day when method=GET api=/draft/two
strategy id=7 algorithm=warm_up rate=10 per=second warm_up_ms=1000 cold_factor=3 when api=/draft/cold
strategy id=8 algorithm=warm_up rate=10 per=second warm_up_ms=10000 cold_factor=3 action=delay max_delay_ms=1000 when api=/slowstart
T
    $n->start;

    # warm_up 100/s over 2 s, cold factor 3, new (cold) strategy. Closed
    # form (README): by t it has admitted 1 + 2W(c - i(t))/(c^2 - s^2),
    # i(t) = sqrt(c^2 - (c^2 - s^2) t/W): 7.8 in the first 200 ms (a third
    # of the rate is 6.7, plus the first request), 39.2 in the first second,
    # then 100/s once warm.
    # Tolerances: nginx's clock moves in whole ms and each admission comes
    # up to one request round trip late, so 5..9 in 200 ms (a warm bucket
    # would give 20) and 88..101 per second after the warm-up.
    my @ok = hammer($n->url('/cold'), 3.6);
    my $first = between(0, 0.2, @ok);
    ok($first >= 5 && $first <= 9, "warm_up cold: $first admitted in the first 200 ms (5..9)");
    my $second_s = between(0, 1, @ok);
    ok($second_s >= 35 && $second_s <= 42, "warm_up: $second_s admitted in the first second (39.2 expected)");
    my $warm = between(2.5, 3.5, @ok);
    ok($warm >= 88 && $warm <= 101, "warm_up after 2 s: $warm admitted in a second (88..101)");

    # delay on warm_up: cold, requests are queued about 300 ms apart (the
    # cold interval, 3 x 1/rate), none refused within the 1 s cap.
    my $t0 = time;
    my @d = $n->codes('/slowstart', 3);
    my $took = time - $t0;
    is_deeply(\@d, [200, 200, 200], 'warm_up + delay: three requests all pass');
    ok($took >= 0.55 && $took < 0.9, sprintf('warm_up + delay: queued about 2 x 300 ms (took %.2f s)', $took));

    # rate_ctl_headers on: the older draft's triple.
    two_a_day($n, 'on', 'RateLimit', sub {
        my ($r) = @_;
        ok(!exists $r->{headers}{'x-ratelimit-limit'} && !exists $r->{headers}{'ratelimit-policy'},
            'on: no other style');
    });

    # legacy: X-RateLimit-*, Reset in seconds until the (day) window ends,
    # not a Unix time.
    two_a_day($n, 'legacy', 'X-RateLimit', sub {
        my ($r) = @_;
        my $reset = $r->{headers}{'x-ratelimit-reset'};
        ok($reset =~ /^\d+$/ && $reset >= 1 && $reset <= 86400,
            "legacy: X-RateLimit-Reset $reset is seconds until reset");
        ok(!exists $r->{headers}{'ratelimit-limit'}, 'legacy: no RateLimit-Limit');
    });

    my $r;

    # draft: RateLimit-Policy and RateLimit structured fields.
    $r = $n->get('/draft/x');
    is($r->{code}, 200, 'draft: first passes');
    my $pol = sf_list($r->{headers}{'ratelimit-policy'} // '');
    my $rl = sf_list($r->{headers}{'ratelimit'} // '');
    ok($pol && @$pol == 1, 'draft: RateLimit-Policy parses as one item')
        or diag $r->{headers}{'ratelimit-policy'};
    ok($rl && @$rl == 1, 'draft: RateLimit parses as one item') or diag $r->{headers}{'ratelimit'};
    is($pol->[0][0], '4', 'draft: the policy is named after the strategy');
    is($pol->[0][1]{q}, 2, 'draft: q = the quota');
    is($pol->[0][1]{w}, 86400, 'draft: w = the window in seconds');
    is($rl->[0][0], '4', 'draft: RateLimit names the same policy');
    is($rl->[0][1]{r}, 1, 'draft: r = remaining');
    ok($rl->[0][1]{t} >= 1 && $rl->[0][1]{t} <= 86400, 'draft: t = seconds until reset');
    ok(!exists $r->{headers}{'ratelimit-limit'}, 'draft: no RateLimit-Limit');
    $n->get('/draft/x');
    $r = $n->get('/draft/x');
    is($r->{code}, 503, 'draft: third rejected');
    $rl = sf_list($r->{headers}{'ratelimit'} // '');
    is($rl->[0][1]{r}, 0, 'draft: r=0 on rejection');
    ok($rl->[0][1]{t} >= 1, 'draft: t >= 1 while limited');
    ok($r->{headers}{'retry-after'} >= 1, 'draft: Retry-After on rejection');

    # Two strategies apply: the tightest one's values (strategy 6, 3/day).
    $r = $n->get('/draft/two');
    $pol = sf_list($r->{headers}{'ratelimit-policy'} // '');
    $rl = sf_list($r->{headers}{'ratelimit'} // '');
    is($pol->[0][0], '6', 'draft, two strategies: the tightest names the policy');
    is($pol->[0][1]{q}, 3, 'draft, two strategies: its quota');
    is($rl->[0][1]{r}, 2, 'draft, two strategies: its remaining');

    # warm_up in the draft style: quota 1 per interval, reset >= 1.
    $r = $n->get('/draft/cold');
    $rl = sf_list($r->{headers}{'ratelimit'} // '');
    is($rl->[0][0], '7', 'draft, warm_up: policy named');
    $r = $n->get('/draft/cold');
    is($r->{code}, 503, 'draft, warm_up: the second request at once is refused (cold: 300 ms apart)');
    $rl = sf_list($r->{headers}{'ratelimit'} // '');
    is($rl->[0][1]{r}, 0, 'draft, warm_up: r=0');
    ok($rl->[0][1]{t} >= 1, 'draft, warm_up: t >= 1');

    # The parser itself refuses what is not a structured field.
    ok(!sf_list('q=2, "x'), 'sf parser refuses a broken list');
    is_deeply(sf_list('"a";q=1;w=2, b;r=0'), [ [ 'a', { q => 1, w => 2 } ], [ 'b', { r => 0 } ] ],
        'sf parser reads two items with parameters');

    $n->stop;
    $n->no_alerts;
});

done_testing;
