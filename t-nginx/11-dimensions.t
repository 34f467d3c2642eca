# How rate_ctl_dimension values are read: a single variable by its index
# (`$arg_NAME` straight from the query string, as nginx's $arg_ finds it),
# `${name}`, templates; a grid of strategies matched by shape.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use RateCtlTest;

for_each_target(sub {
    my ($t) = @_;
    my $n = RateCtlTest->new($t,
        http => q{
            rate_ctl_dimension a $arg_a;
            rate_ctl_dimension b ${arg_B};
            rate_ctl_dimension hdr $http_x_user;
            rate_ctl_dimension tpl "t-$arg_t";
            rate_ctl_dimension m $arg_mapped;
            map $arg_m $arg_mapped { default "mapped-$arg_m"; }
        },
        server => q{
            rate_ctl on;
            location / { empty_gif; }
            location /set { set $arg_a a-set; empty_gif; }
        });
    my $grid = '';
    my $id = 100;
    for my $i (0 .. 29) {
        for my $j (0 .. 29) {
            $grid .= sprintf "strategy id=%d algorithm=fixed_window rate=2 per=day when a=a%d b=b%d\n", $id++, $i, $j;
        }
    }
    publish($n->shm, <<"T");
strategy id=1 algorithm=fixed_window rate=1 per=day when a=one
strategy id=2 algorithm=fixed_window rate=1 per=day when hdr=u1
strategy id=3 algorithm=fixed_window rate=1 per=day when tpl=t-x
strategy id=4 algorithm=fixed_window rate=1 per=day when m=mapped-q
strategy id=5 algorithm=fixed_window rate=1 per=day when a=a-set
$grid
T
    $n->start;

    is_deeply([$n->codes('/?a=one', 2)], [200, 503], '$arg_a: limited');
    is_deeply([$n->codes('/?x=1&A=one', 2)], [503, 503], '$arg_a: the name in any case, not first');
    is_deeply([$n->codes('/?xa=one&ab=one&a=', 2)], [200, 200], '$arg_a: only the item named a (empty: absent)');
    is_deeply([$n->codes('/', 2, '-H "X-User: u1"')], [200, 503], '$http_x_user: limited');
    is_deeply([$n->codes('/?t=x', 2)], [200, 503], 'template "t-$arg_t": limited');
    is_deeply([$n->codes('/?m=q', 2)], [200, 503], 'a map-defined $arg_mapped is read through nginx');
    is_deeply([$n->codes('/set?a=zzz', 2)], [200, 503], 'set $arg_a overrides the query string, as in nginx');

    # The grid: every (a, b) pair its own strategy, 2 a day.
    is_deeply([$n->codes('/?a=a7&b=b29', 3)], [200, 200, 503], 'grid a7 b29: its own limit');
    is_deeply([$n->codes('/?B=b29&a=a7', 1)], [503], 'grid: the same pair in another order and case');
    is_deeply([$n->codes('/?a=a7&b=b28', 3)], [200, 200, 503], 'grid a7 b28: a separate limit');
    is_deeply([$n->codes('/?a=a7', 3)], [200, 200, 200], 'grid: a alone matches no cell');
    is_deeply([$n->codes('/?a=a30&b=b1', 3)], [200, 200, 200], 'grid: a value outside it passes');
    $n->no_alerts;
});

done_testing();
