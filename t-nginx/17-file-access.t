# Issue 28: nginx's workers cannot change the rules. A real agent (SQLite
# store) started with --mode 0660 --group nogroup writes two files: the
# configuration (header, segments, blacklist) root:nogroup 0640 and the
# state file beside it (PATH.state: counters, key table, ledger)
# root:nogroup 0660. The user nobody (group nogroup) reads the
# configuration but opening it for writing fails with EACCES; nginx with
# its workers as nobody:nogroup still enforces a 2/day strategy exactly
# (its counters are in the state file, which the workers write).
# Workers refuse a configuration owned by anyone but root or
# rate_ctl_shm_owner, or, without it, the owner of the file's directory.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Errno qw(EACCES);
use POSIX ();
use Time::HiRes qw(sleep);
use RateCtlTest;

plan skip_all => 'needs root (workers as nobody, files given to nogroup)' unless $> == 0;
my $bin = rate_ctl_bin();
my (undef, undef, $nobody) = getpwnam('nobody') or BAIL_OUT('no user nobody');
my $nogroup = getgrnam('nogroup') // BAIL_OUT('no group nogroup');

# What a process of nobody:nogroup gets opening $path: 'ok' or the errno.
sub open_as_nobody {
    my ($path, $mode) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        $( = $nogroup;
        $) = "$nogroup $nogroup";
        $< = $> = $nobody;
        my $ok = open(my $fh, $mode, $path);
        POSIX::_exit($ok ? 0 : $! + 0);
    }
    waitpid $pid, 0;
    return $? >> 8;
}

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t, main => 'user nobody nogroup;', server => stats_server());
    my $d = $n->dir;
    my $store = "sqlite:$d/rate-ctl.db";
    my $id = `$bin --store $store strategy add --name two --match api=/two --algorithm fixed_window --rate 2 --per day`;
    BAIL_OUT('strategy add failed') if $?;
    like($id, qr/^\d+$/, 'strategy added');
    my $agent = spawn("agent $t->{name}", "$d/agent.log", $bin, '--store', $store, 'agent', '--shm', $n->shm,
        '--host-id', 't17', '--poll-ms', '50', '--mode', '0660', '--group', 'nogroup');
    my $published = wait_until(10, sub { `$bin shm inspect --json @{[$n->shm]} 2>/dev/null` =~ /"two"/ });
    ok($published, 'the agent published the strategy') or diag(slurp("$d/agent.log"));
    my $state = $n->shm . '.state';
    my @c = stat $n->shm;
    my @s = stat $state;
    is(sprintf('%d:%d %o', $c[4], $c[5], $c[2] & 07777), "0:$nogroup 640", 'configuration root:nogroup 0640');
    is(sprintf('%d:%d %o', $s[4], $s[5], $s[2] & 07777), "0:$nogroup 660", 'state file root:nogroup 0660');
    is(open_as_nobody($n->shm, '<'), 0, 'nobody reads the configuration');
    is(open_as_nobody($n->shm, '+<'), EACCES, 'nobody opening the configuration for writing: EACCES');
    is(open_as_nobody($state, '+<'), 0, 'nobody writes the state file');

    $n->start;
    my @w = $n->worker_pids;
    my @uids = map { (stat "/proc/$_")[4] } @w;
    is_deeply(\@uids, [map { $nobody } @w], 'workers run as nobody');
    is_deeply([$n->codes('/two', 5)], [200, 200, 503, 503, 503], '2/day enforced exactly by workers as nobody');
    like($n->error_log, qr/enforcing 1 strategies/, 'the workers map the pair');
    unlike($n->error_log, qr/Permission denied|requests pass unlimited/, 'no access error');
    $n->stop;

    # rate_ctl_shm_owner: a configuration owned by anyone but root or the
    # named user is refused (fail open, one line naming the owner).
    my $o = RateCtlTest->new($t, main => 'user nobody nogroup;', server => stats_server(),
        shm => $n->shm, http => 'rate_ctl_shm_owner daemon;');
    $o->start;
    is_deeply([$o->codes('/two', 1)], [503], 'root-owned configuration with rate_ctl_shm_owner daemon: enforced');
    $o->stop;
    kill 'STOP', $agent;    # not put right while we look
    chown $nobody, -1, $n->shm or die "chown: $!";
    my $p = RateCtlTest->new($t, main => 'user nobody nogroup;', server => stats_server(),
        shm => $n->shm, http => 'rate_ctl_shm_owner daemon;');
    $p->start;
    is_deeply([$p->codes('/two', 3)], [200, 200, 200], 'owned by nobody, rate_ctl_shm_owner daemon: fails open');
    like($p->error_log, qr/not trusted: owned by nobody .*neither root nor rate_ctl_shm_owner/, 'the refusal names the owner');
    $p->stop;
    # Without rate_ctl_shm_owner: a configuration owned by anyone but root
    # or the owner of its directory (here root: the test's directory, as
    # /run/rate-ctl is the agent's) is refused: fails open, one line (one
    # worker). The root-owned file in the same directory is enforced above.
    my $q = RateCtlTest->new($t, main => 'user nobody nogroup;', server => stats_server(),
        shm => $n->shm, workers => 1);
    $q->start;
    is_deeply([$q->codes('/two', 3)], [200, 200, 200],
        'owned by nobody in a root-owned directory, no rate_ctl_shm_owner: fails open');
    my @refused = grep { /not trusted/ } split /\n/, $q->error_log;
    is(scalar @refused, 1, 'one log line') or diag($q->error_log);
    like($refused[0] // '', qr/not trusted: owned by nobody \(uid $nobody\), neither root nor the owner of \Q$d\E \(root \(uid 0\)\)/,
        'naming the owner and the directory');
    $q->stop;
    kill 'CONT', $agent;
    my $bad = RateCtlTest->new($t, http => 'rate_ctl_shm_owner no-such-user-i28;');
    my ($rc, $out) = $bad->test_conf;
    isnt($rc, 0, 'an unknown user fails nginx -t');
    like($out, qr/unknown user "no-such-user-i28" in "rate_ctl_shm_owner" directive/, 'naming the directive');
    stop_one("agent $t->{name}");
});

done_testing;
