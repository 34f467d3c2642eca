# A worker whose time reading is stale (61 s, 600 s) never admits extra
# (issue 11, item 5). A second nginx shares the first one's file with an
# LD_PRELOAD shim, built here with cc, that sets CLOCK_MONOTONIC(_COARSE)
# and the wall clock (CLOCK_REALTIME(_COARSE), gettimeofday, time) back:
# nginx's cached ngx_current_msec and time of day both lag. The fresh
# instance drains each quota, the stale one is tried, then the fresh one
# again: nothing more passes than the quota. Before the fix the stale
# worker took the newer state for foreign and rewound it (40 of 20 passed).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX qw(fmod);
use Time::HiRes qw(sleep time);
use File::Temp ();
use RateCtlTest;

my $shim_dir = File::Temp::tempdir('rate_ctl_shim_XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $shim_dir;
open my $c, '>', "$shim_dir/shim.c" or die $!;
print $c <<'C';
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

/* Read once at load: nginx workers run with a cleared environment. */
static long shift_s;
__attribute__((constructor)) static void init(void) {
    const char *s = getenv("RATE_CTL_STALE_S");
    shift_s = s ? atol(s) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE
                    || id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        ts->tv_sec -= shift_s;
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    (void)tz;
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
C
close $c;
my $out = `cc -shared -fPIC -O2 -o $shim_dir/shim.so $shim_dir/shim.c -ldl 2>&1`;
die "cc failed: $out" if $?;

my $server = q{
    rate_ctl on;
    location / { empty_gif; }
};

for_each_target(sub {
    my ($t) = @_;
    for my $stale (61, 600) {
        my $fresh = RateCtlTest->new($t, workers => 1, server => $server);
        publish($fresh->shm, <<'T');
strategy id=1 algorithm=fixed_window rate=20 per=second when api=/f
strategy id=2 algorithm=token_bucket rate=1 per=minute burst=5 when api=/b
strategy id=3 algorithm=sliding_window rate=5 per=minute when api=/s
strategy id=4 algorithm=fixed_window rate=5 per=hour when api=/h
strategy id=5 algorithm=warm_up rate=1 per=minute warm_up_ms=60000 cold_factor=3 when api=/w
T
        $fresh->start;
        my $old = RateCtlTest->new($t, workers => 1, server => $server, shm => $fresh->shm);
        {
            local $ENV{LD_PRELOAD} = "$shim_dir/shim.so";
            local $ENV{RATE_CTL_STALE_S} = $stale;
            $old->start;
        }
        # The shim works: the stale instance's Date header lags.
        my $date = $old->get('/none')->{headers}{date} // '';
        my $lag = int(time - (str2time($date) // time) + 0.5);
        ok($lag >= $stale - 2 && $lag <= $stale + 2, "$t->{name}: the shimmed nginx is $stale s stale (Date lags ${lag} s)");

        # Fresh drains, stale tries, fresh tries again: all in one window
        # (not near a second, minute or hour boundary).
        for my $case (['/f', 20], ['/b', 5], ['/s', 5], ['/h', 5], ['/w', 1]) {
            my ($path, $quota) = @$case;
            for (1 .. 200) {
                my $f = fmod(time, 1);
                my $m = fmod(time, 60);
                my $h = fmod(time, 3600);
                last if $f < 0.5 && $m > 0.5 && $m < 58 && $h > 1 && $h < 3598;
                sleep 0.02;
            }
            my $first = RateCtlTest::count_of(200, $fresh->codes($path, $quota + 5));
            my $by_stale = RateCtlTest::count_of(200, $old->codes($path, $quota + 5));
            my $after = RateCtlTest::count_of(200, $fresh->codes($path, $quota + 5));
            is($first, $quota, "$t->{name}: $path: the fresh instance gets the quota ($quota)");
            is($by_stale + $after, 0,
               "$t->{name}: $path: $stale s stale, nothing extra (stale $by_stale, fresh after $after)");
        }
        $old->stop;
        $fresh->stop;
        $old->no_alerts;
        $fresh->no_alerts;
    }
});

# RFC 7231 IMF-fixdate to Unix seconds.
sub str2time {
    my ($s) = @_;
    my %mon = (Jan => 0, Feb => 1, Mar => 2, Apr => 3, May => 4, Jun => 5,
               Jul => 6, Aug => 7, Sep => 8, Oct => 9, Nov => 10, Dec => 11);
    my ($d, $mo, $y, $H, $M, $S) = $s =~ /(\d+) (\w{3}) (\d{4}) (\d+):(\d+):(\d+)/ or return;
    require Time::Local;
    return Time::Local::timegm($S, $M, $H, $d, $mon{$mo}, $y);
}

done_testing;
