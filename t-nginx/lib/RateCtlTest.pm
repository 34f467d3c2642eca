package RateCtlTest;

# Small curl-driven harness: starts a real nginx in its own prefix with the
# rate_ctl module loaded, publishes tables with the core writer (through
# t-nginx/tool), drives requests with curl and checks error.log.
#
# Targets (both by default, RATE_CTL_TARGETS=vendored,debian to choose):
#   vendored: target/modules/vendored/nginx  + .../vendored/ngx_http_rate_ctl_module.so
#   debian:   /usr/sbin/nginx                + target/modules/debian/ngx_http_rate_ctl_module.so
# Build them with scripts/build-module.sh; t-nginx/run.sh does it all.

use strict;
use warnings;
use Exporter 'import';
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use IO::Socket::IP;
use POSIX qw(:sys_wait_h fmod);
use Time::HiRes qw(sleep time);
use Test::More;

our @EXPORT = qw(targets for_each_target root tool publish window_ahead stats_server
    many_clients_server limited_server agent_access workers_main rate_ctl_bin slurp wait_until spawn stop_one
    stop_all track reap);

# `rate-ctl agent` makes its files 0640/0660 for their group (modes open to
# other users are refused). As root, nginx's workers run as nobody:nogroup:
# the agent's extra arguments that give its files to nogroup, and the main
# context line that says whom the workers run as (`main =>`).
sub agent_access { $> == 0 ? ('--group', 'nogroup') : () }
sub workers_main { $> == 0 ? 'user nobody nogroup;' : '' }

# The server block of a test that limits every location, answered by
# empty_gif, followed by the test's own lines (locations, directives).
sub limited_server {
    return join "\n", '    rate_ctl on;', '    location / { empty_gif; }', map {"    $_"} @_;
}

# The server block of a test that limits every location and reads the
# counts at /rate_ctl (not itself limited).
sub stats_server { limited_server('location = /rate_ctl { rate_ctl off; rate_ctl_stats; }') }

# A server block whose clients are many: the address comes from
# X-Forwarded-For (realip, trusted from 127.0.0.1); every location is
# limited, the counts are read at /stats.
sub many_clients_server {
    return q{
            set_real_ip_from 127.0.0.1;
            real_ip_header X-Forwarded-For;
            rate_ctl on;
            location / { empty_gif; }
            location /stats { rate_ctl off; rate_ctl_stats; }
        };
}

my $ROOT = abs_path(dirname(__FILE__) . '/../..');
sub root { $ROOT }

sub targets {
    my %all = (
        vendored => {
            name   => 'vendored',
            nginx  => "$ROOT/target/modules/vendored/nginx",
            module => "$ROOT/target/modules/vendored/ngx_http_rate_ctl_module.so",
        },
        debian => {
            name   => 'debian',
            nginx  => $ENV{RATE_CTL_DEBIAN_NGINX} // '/usr/sbin/nginx',
            module => "$ROOT/target/modules/debian/ngx_http_rate_ctl_module.so",
        },
    );
    my @want = split /,/, ($ENV{RATE_CTL_TARGETS} // 'vendored,debian');
    my @t;
    for my $w (@want) {
        my $t = $all{$w} or BAIL_OUT("unknown target $w");
        BAIL_OUT("$w: $t->{nginx} missing; run scripts/build-module.sh $w") unless -x $t->{nginx};
        BAIL_OUT("$w: $t->{module} missing; run scripts/build-module.sh $w") unless -f $t->{module};
        push @t, $t;
    }
    return @t;
}

# Runs $code->($target) in a subtest per target.
sub for_each_target {
    my ($code) = @_;
    for my $t (targets()) {
        subtest $t->{name} => sub { $code->($t) };
    }
}

# The `rate-ctl` binary (RATE_CTL_BIN, else the debug build).
sub rate_ctl_bin {
    my $bin = $ENV{RATE_CTL_BIN} // "$ROOT/target/debug/rate-ctl";
    BAIL_OUT("$bin missing; run cargo build --bin rate-ctl") unless -x $bin;
    return $bin;
}

# slurp($file): its text ('' if it cannot be read).
sub slurp { my ($f) = @_; open my $fh, '<', $f or return ''; local $/; <$fh> }

# wait_until(SECONDS, CODE): polls CODE every 50 ms; its value or undef.
sub wait_until {
    my ($limit, $code) = @_;
    my $end = time + $limit;
    while (time < $end) { my $v = $code->(); return $v if $v; sleep 0.05 }
    return undef;
}

# The processes a test started with spawn (name => pid), stopped at exit.
our %pids;
END { stop_all() }

# spawn(NAME, LOG, ARGV...): a child process with stdout and stderr to LOG.
sub spawn {
    my ($name, $log, @argv) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDOUT, '>>', $log or die "$log: $!";
        open STDERR, '>&', \*STDOUT or die;
        $ENV{NO_COLOR} = 1;
        delete @ENV{qw(RATE_CTL_ADMIN_TOKEN RATE_CTL_READ_TOKEN RATE_CTL_AGENT_TOKEN)};
        exec @argv or die "exec $argv[0]: $!";
    }
    $pids{$name} = $pid;
    return $pid;
}

# stop_one(NAME [, SIGNAL]): SIGNAL (TERM) to the process spawned as NAME,
# SIGKILL after 5 s; reaped.
sub stop_one {
    my ($name, $sig) = @_;
    my $pid = delete $pids{$name} or return;
    kill $sig // 'TERM', $pid;
    for (1 .. 100) { return if waitpid($pid, WNOHANG) != 0; sleep 0.05 }
    kill 'KILL', $pid;
    waitpid $pid, 0;
}

sub stop_all { stop_one($_) for sort keys %pids }

# track(NAME, PID): a child the test forked itself, stopped like a spawned one.
sub track { my ($name, $pid) = @_; $pids{$name} = $pid }

# reap(REGEX): waits for every process whose name matches to exit.
sub reap {
    my ($re) = @_;
    for my $name (grep { $_ =~ $re } keys %pids) { waitpid delete $pids{$name}, 0 }
}

# The table tool (core Writer). Built by t-nginx/run.sh.
sub tool {
    my $bin = $ENV{RATE_CTL_TEST_TOOL} // "$ROOT/target/debug/examples/rate-ctl-test-tool";
    BAIL_OUT("$bin missing; run cargo build --example rate-ctl-test-tool") unless -x $bin;
    return $bin;
}

# publish($shm_path, $table_text [, $config_version]): writes the table.
sub publish {
    my ($shm, $table, $version) = @_;
    $version //= 1;
    my $dir = tempdir(CLEANUP => 1);
    open my $fh, '>', "$dir/table" or die $!;
    print $fh $table;
    close $fh;
    my $out = `umask 0; @{[tool()]} publish $shm $dir/table $version 2>&1`;
    die "publish failed: $out" if $?;
    return $out;
}

sub free_port {
    my ($host) = @_;
    my $s = IO::Socket::IP->new(LocalHost => $host // '127.0.0.1', LocalPort => 0, Listen => 1, ReuseAddr => 1)
        or die "no free port: $!";
    my $p = $s->sockport;
    close $s;
    return $p;
}

# new($target, http => ..., server => ..., main => ..., ipv6 => 1, workers => 2)
# `main` goes into the main context (e.g. `user nobody nogroup;`).
# `http` goes into the http block, `server` into the server block. The
# server listens on 127.0.0.1:$port (and [::1]:$port6 with ipv6).
sub new {
    my ($class, $t, %o) = @_;
    my $dir = tempdir('rate_ctl_t_XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{RATE_CTL_KEEP});
    chmod 0755, $dir;    # workers run as nobody when the tests run as root
    mkdir "$dir/logs";
    mkdir "$dir/html";
    my $self = bless {
        t       => $t,
        dir     => $dir,
        port    => free_port('127.0.0.1'),
        shm     => $o{shm} // "$dir/shm",
        workers => $o{workers} // 2,
        %o,
    }, $class;
    $self->{port6} = free_port('::1') if $o{ipv6};
    $self->write_conf;
    return $self;
}

sub dir  { $_[0]{dir} }
sub port { $_[0]{port} }
sub shm  { $_[0]{shm} }
sub url  { my ($s, $p) = @_; "http://127.0.0.1:$s->{port}$p" }
sub url6 { my ($s, $p) = @_; "http://[::1]:$s->{port6}$p" }

sub conf_text {
    my ($self) = @_;
    my $d = $self->{dir};
    my $listen6 = $self->{port6} ? "listen [::1]:$self->{port6};" : '';
    my $http = $self->{http} // '';
    my $lopts = $self->{listen_opts} // '';
    my $server = $self->{server} // '';
    my $main = $self->{main} // '';    # main-context directives (e.g. env)
    $http =~ s/\@SHM\@/$self->{shm}/g;
    $http =~ s/\@DIR\@/$d/g;
    $server =~ s/\@DIR\@/$d/g;
    return <<"CONF";
load_module $self->{t}{module};
worker_processes $self->{workers};
$main
pid $d/nginx.pid;
error_log $d/logs/error.log notice;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    log_format rate_ctl '\$status \$rate_ctl_status \$rate_ctl_strategy \$uri';
    rate_ctl_shm $self->{shm};
    $http
    server {
        listen 127.0.0.1:$self->{port} $lopts;
        $listen6
        access_log $d/logs/access.log rate_ctl;
        root $d/html;
        $server
    }
}
CONF
}

sub write_conf {
    my ($self) = @_;
    open my $fh, '>', "$self->{dir}/nginx.conf" or die $!;
    print $fh $self->conf_text;
    close $fh;
}

# nginx -t; returns (exit code, output).
sub test_conf {
    my ($self) = @_;
    my $out = `$self->{t}{nginx} -p $self->{dir}/ -c $self->{dir}/nginx.conf -e $self->{dir}/logs/error.log -t 2>&1`;
    return ($? >> 8, $out);
}

sub start {
    my ($self) = @_;
    my $out = `$self->{t}{nginx} -p $self->{dir}/ -c $self->{dir}/nginx.conf -e $self->{dir}/logs/error.log 2>&1`;
    die "nginx failed to start: $out" if $?;
    for (1 .. 100) {
        if (-s "$self->{dir}/nginx.pid" && IO::Socket::IP->new(PeerHost => '127.0.0.1', PeerPort => $self->{port})) {
            $self->{pid} = $self->master_pid;
            # Let every worker come up.
            for (1 .. 50) { last if $self->worker_pids >= $self->{workers}; sleep 0.05 }
            return $self;
        }
        sleep 0.05;
    }
    die "nginx did not come up: " . $self->error_log;
}

sub master_pid {
    my ($self) = @_;
    open my $fh, '<', "$self->{dir}/nginx.pid" or return;
    my $p = <$fh>;
    chomp $p;
    return $p;
}

sub worker_pids {
    my ($self) = @_;
    my $m = $self->{pid} or return ();
    my @w = grep { length } split /\s+/, `ps -o pid= --ppid $m 2>/dev/null`;
    return @w;
}

# Graceful reload (only where a test is about reload).
sub reload {
    my ($self) = @_;
    my @old = $self->worker_pids;
    kill 'HUP', $self->{pid};
    for (1 .. 100) {
        my %old = map { $_ => 1 } @old;
        my @new = grep { !$old{$_} } $self->worker_pids;
        return if @new >= $self->{workers} && !grep { kill 0, $_ } @old;
        sleep 0.05;
    }
}

sub stop {
    my ($self) = @_;
    my $pid = delete $self->{pid} or return;
    kill 'TERM', $pid;
    for (1 .. 100) {
        return unless kill 0, $pid;
        sleep 0.05;
    }
    kill 'KILL', $pid;
}

sub DESTROY { $_[0]->stop }

sub error_log { slurp("$_[0]{dir}/logs/error.log") }

# The lines of access.log once it has stopped growing. nginx writes a
# request's line in the log phase, after the response has gone out: a
# client can hold the last answer before its line is in the file, so one
# read right after the last request may miss it (t-nginx/13 once counted
# 99 of 100 ALLOWED lines). Read until two reads 50 ms apart agree (at
# most 3 s).
sub access_log {
    my ($self) = @_;
    my $read = sub {
        open my $fh, '<', "$self->{dir}/logs/access.log" or return ();
        return map { chomp; $_ } <$fh>;
    };
    my @lines = $read->();
    my $end = time + 3;
    while (time < $end) {
        sleep 0.05;
        my @again = $read->();
        return @again if @again == @lines;
        @lines = @again;
    }
    return @lines;
}

# slow_file: html/slow/big, 240 KiB; under `location /slow/ { limit_rate 8k;
# limit_rate_after 0; }` a request for it lasts about 30 s.
sub slow_file {
    my ($self) = @_;
    mkdir "$self->{dir}/html/slow";
    open my $fh, '>', "$self->{dir}/html/slow/big" or die "html/slow/big: $!";
    print $fh 'x' x (240 * 1024);
    close $fh or die "html/slow/big: $!";
}

# background_get($path, $max_s): a curl for $path in a child process that
# gives up after $max_s seconds; returns its pid (for kill and waitpid).
sub background_get {
    my ($self, $path, $max_s) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) { exec 'curl', '-s', '-o', '/dev/null', '-m', $max_s, $self->url($path); exit 1 }
    return $pid;
}

# Asserts that error.log has no [alert], [crit] or [emerg] line.
sub no_alerts {
    my ($self) = @_;
    my @bad = grep { /\[(alert|crit|emerg)\]/ } split /\n/, $self->error_log;
    ok(!@bad, "$self->{t}{name}: no [alert]/[crit]/[emerg] in error.log") or diag join "\n", @bad;
}

# get($path, @curl_args): one request; returns {code, headers => {lc name => value}, body}.
sub get {
    my ($self, $path, @args) = @_;
    my $url = $path =~ m{^http} ? $path : $self->url($path);
    my $out = `curl -s -S -m 10 -D - @args '$url' 2>&1`;
    my ($head, $body) = split /\r\n\r\n/, $out, 2;
    my ($code) = $head =~ m{^HTTP/\S+ (\d{3})};
    my %h;
    for (split /\r\n/, $head) { $h{lc $1} = $2 if /^([^:]+):\s*(.*)$/ }
    return { code => $code // 0, headers => \%h, body => $body // '' };
}

# codes($path, $n, @curl_args): $n back-to-back requests on one keep-alive
# connection; returns the list of status codes.
sub codes {
    my ($self, $path, $n, @args) = @_;
    my $url = $path =~ m{^http} ? $path : $self->url($path);
    my $urls = join ' ', map {"-o /dev/null '$url'"} 1 .. $n;
    my $out = `curl -s -m 30 -w '%{http_code}\\n' @args $urls`;
    return split /\n/, $out;
}

# rejected_after($path, $n, $t0, $limit_s, $pause_s): polls $n requests to
# $path every $pause_s until the last one is rejected (503); returns the
# seconds since $t0 then, or undef once $limit_s have passed since $t0.
sub rejected_after {
    my ($self, $path, $n, $t0, $limit, $pause) = @_;
    while (time - $t0 < $limit) {
        my @c = $self->codes($path, $n);
        return time - $t0 if $c[-1] == 503;
        sleep $pause;
    }
    return undef;
}

# window_ahead($period_s, $need_s): returns once at least $need_s seconds
# are left in the current fixed window of $period_s seconds, sleeping into
# the next window if fewer are. Fixed and sliding windows are multiples of
# the period on the wall clock (UTC, nginx's cached time of day), so an
# exact count is not split by a window boundary in the middle of a burst.
sub window_ahead {
    my ($period, $need) = @_;
    my $left = $period - fmod(time, $period);
    sleep($left + 0.05) if $left < $need;
}

sub count_of {
    my ($code, @codes) = @_;
    return scalar grep { $_ == $code } @codes;
}

1;
