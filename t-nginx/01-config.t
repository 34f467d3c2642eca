# nginx -t: every bad directive argument stops the configuration test with
# a message naming the directive and the value; good configurations pass.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use RateCtlTest;

my @bad = (
    [ 'rate_ctl maybe;', 'server', qr/invalid value "maybe" in "rate_ctl" directive/ ],
    [ 'rate_ctl on; rate_ctl off;', 'server', qr/"rate_ctl" directive is duplicate/ ],
    [ 'rate_ctl_status 302;', 'server', qr/invalid status "302" in "rate_ctl_status" directive/ ],
    [ 'rate_ctl_status 600;', 'server', qr/invalid status "600" in "rate_ctl_status"/ ],
    [ 'rate_ctl_status abc;', 'server', qr/invalid status "abc" in "rate_ctl_status"/ ],
    [ 'rate_ctl_blacklist_status 200;', 'server', qr/invalid status "200" in "rate_ctl_blacklist_status"/ ],
    [ 'rate_ctl_dry_run yes;', 'server', qr/invalid value "yes" in "rate_ctl_dry_run"/ ],
    [ 'rate_ctl_headers 1;', 'server', qr/invalid value "1" in "rate_ctl_headers"/ ],
    [ 'rate_ctl_headers ietf;', 'server',
      qr/invalid value "ietf" in "rate_ctl_headers" directive, it must be "off", "on", "legacy" or "draft"/ ],
    [ 'rate_ctl_headers on draft;', 'server', qr/invalid number of arguments in "rate_ctl_headers"/ ],
    [ 'rate_ctl_log_level debug;', 'server', qr/invalid level "debug" in "rate_ctl_log_level"/ ],
    [ 'rate_ctl_dimension UserId $cookie_uid;', 'http', qr/invalid dimension name "UserId" in "rate_ctl_dimension"/ ],
    [ 'rate_ctl_dimension 9x $cookie_uid;', 'http', qr/invalid dimension name "9x"/ ],
    [ 'rate_ctl_dimension userid $cookie_uid; rate_ctl_dimension userid $arg_u;', 'http',
      qr/duplicate dimension "userid" in "rate_ctl_dimension"/ ],
    [ 'rate_ctl_dimension ip $http_x_ip;', 'http', qr/dimension "ip" in "rate_ctl_dimension" directive is built in/ ],
    [ 'rate_ctl_dimension userid "";', 'http', qr/empty value for dimension "userid"/ ],
    [ 'rate_ctl_dimension userid $no_such_variable_here;', 'http', qr/unknown "no_such_variable_here" variable/ ],
    [ 'rate_ctl_dimension userid;', 'http', qr/invalid number of arguments in "rate_ctl_dimension"/ ],
    [ 'rate_ctl_shm relative/path;', 'http', qr/invalid path "relative\/path" in "rate_ctl_shm"/ ],
    [ 'location /s { rate_ctl_stats on; }', 'server', qr/invalid number of arguments in "rate_ctl_stats"/ ],
    [ 'rate_ctl_stats;', 'server', qr/"rate_ctl_stats" directive is not allowed here/ ],
);

my @good = (
    [ 'rate_ctl_dimension userid $cookie_uid; rate_ctl_dimension appid "app-$arg_appid";',
      'rate_ctl on; rate_ctl_status 429; rate_ctl_blacklist_status 451; rate_ctl_dry_run off;'
          . ' rate_ctl_log_level warn; rate_ctl_headers on;'
          . ' location / { rate_ctl_status 599; empty_gif; } location /st { rate_ctl_stats; }'
          . ' location /l { rate_ctl_headers legacy; } location /d { rate_ctl_headers draft; }'
          . ' location /o { rate_ctl_headers off; }' ],
);

for_each_target(sub {
    my ($t) = @_;
    for my $case (@bad) {
        my ($snippet, $where, $re) = @$case;
        # The shm path is given by the harness; a second rate_ctl_shm would be a duplicate.
        my $n = RateCtlTest->new($t, $where eq 'http' ? (http => $snippet) : (server => $snippet));
        if ($snippet =~ /rate_ctl_shm/) {
            $n = RateCtlTest->new($t, http => '', shm => 'relative/path');
        }
        my ($rc, $out) = $n->test_conf;
        isnt($rc, 0, "nginx -t fails: $snippet");
        like($out, $re, "  message names it: $snippet");
        like($out, qr/\[emerg\].*nginx\.conf:\d+/, '  with file and line') if $rc && $snippet !~ /no_such_variable/;
    }
    my $n = RateCtlTest->new($t, server => 'rate_ctl_shm /tmp/x;');
    my ($rc, $out) = $n->test_conf;
    like($out, qr/"rate_ctl_shm" directive is (not allowed here|duplicate)/, 'rate_ctl_shm only in http');

    for my $case (@good) {
        my $n = RateCtlTest->new($t, http => $case->[0], server => $case->[1]);
        my ($rc, $out) = $n->test_conf;
        is($rc, 0, 'a complete configuration passes nginx -t') or diag $out;
    }
});

done_testing;
