# rate_ctl's memory apart from nginx's heap (issue 29): the module has its
# own mmap-backed allocator, so a large table loaded by a worker (at start,
# on the event loop, and later on the helper thread) never sits in the
# worker's glibc heap (`[heap]` in /proc/PID/smaps), and replacing the
# table again and again reuses the module's memory instead of growing it.
# Before the allocator (glibc malloc, vendored build): [heap] 256 -> 260 kB
# with the 16,000 strategies, and the worker's RSS 30,152 -> 36,532 kB over
# six more tables; with it: 256 kB both, 21,808 -> 21,812 kB.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use RateCtlTest;

# Resident kB of the worker's [heap] mapping and of the whole process.
sub heap_and_rss {
    my ($pid) = @_;
    my $smaps = slurp("/proc/$pid/smaps");
    my ($heap) = $smaps =~ /\[heap\]\n(?:.*\n)*?Rss:\s+(\d+) kB/;
    my ($rss) = slurp("/proc/$pid/status") =~ /^VmRSS:\s+(\d+) kB/m;
    return ($heap // 0, $rss // 0);
}

# $n strategies, and one that limits /pv$version to a request a day (how
# a test sees that the worker enforces this version).
sub table {
    my ($n, $tag, $version) = @_;
    join '', (map { "strategy id=$_ algorithm=fixed_window rate=100 per=minute when userid=u$tag$_ api=/y$_\n" } 1 .. $n - 1),
        "strategy id=$n algorithm=fixed_window rate=1 per=day when api=/pv$version\n";
}

sub enforced {
    my ($n, $version) = @_;
    wait_until(20, sub { $n->get("/pv$version")->{code} == 503 });
}

for_each_target(sub {
    my ($t) = @_;
    # One small table, then one of 16,000 strategies, in two nginx runs:
    # the worker's glibc heap must not grow with the table.
    my %heap;
    for my $size (1, 16_000) {
        my $n = RateCtlTest->new($t, workers => 1, server => limited_server());
        publish($n->shm, table($size, 'a', 1), 1);
        $n->start;
        ok(enforced($n, 1), "$size strategies enforced");
        is($n->get('/x')->{code}, 200, 'a request is served');
        my ($w) = $n->worker_pids;
        ($heap{$size}) = heap_and_rss($w);
        if ($size > 1) {
            # 8 more tables of 16,000, each built on the helper thread.
            my @rss;
            for my $v (2 .. 9) {
                publish($n->shm, table($size, $v % 2 ? 'b' : 'c', $v), $v);
                ok(enforced($n, $v), "version $v enforced") or last;
                push @rss, (heap_and_rss($w))[1] if $v == 3 || $v == 9;
            }
            cmp_ok($rss[1], '<=', $rss[0] * 1.05 + 1024,
                "replacing the table 6 more times does not grow the worker (RSS $rss[0] kB -> $rss[1] kB)");
            my ($heap_after) = heap_and_rss($w);
            cmp_ok($heap_after, '<=', $heap{1},
                "after 9 tables the worker's glibc heap is still nginx's own ($heap_after kB, $heap{1} kB with one strategy)");
        }
        $n->stop;
        $n->no_alerts;
    }
    cmp_ok($heap{16_000}, '<=', $heap{1},
        "16,000 strategies leave the worker's glibc heap as one does ($heap{16_000} kB against $heap{1} kB)");
});

done_testing;
