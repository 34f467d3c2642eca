# How rate_ctl_dimension values are read: a single variable by its index
# (`$arg_NAME` straight from the query string, as nginx's $arg_ finds it),
# `${name}`, templates; a grid of strategies matched by shape. The module
# reads a plain `$arg_NAME` from the query string itself: per-key
# strategies show through `$rate_ctl_key` which value it read, compared
# with nginx's own `$arg_a` on the same request (first item, name in any
# case, `xa=`/`ab=` not it, empty and absent alike), and with the `last`
# and `decode` flags' own rules.
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
            rate_ctl_dimension w $arg_w last;
            rate_ctl_dimension d $arg_d decode;
            map $arg_m $arg_mapped { default "mapped-$arg_m"; }
        },
        server => q{
            rate_ctl on;
            location / { empty_gif; }
            location /set { set $arg_a a-set; empty_gif; }
            location /kw { add_header X-Key "[$rate_ctl_key]" always; empty_gif; }
            location /kd { add_header X-Key "[$rate_ctl_key]" always; empty_gif; }
            location /k {
                add_header X-Arg "[$arg_a]" always;
                add_header X-Key "[$rate_ctl_key]" always;
                empty_gif;
            }
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
strategy id=6 algorithm=fixed_window rate=1000 per=day each=a when api=/k
strategy id=7 algorithm=fixed_window rate=1000 per=day each=w when api=/kw
strategy id=8 algorithm=fixed_window rate=1000 per=day each=d when api=/kd
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

    # The value the module reads for `$arg_a` is nginx's, request by
    # request (an empty value is absent: no key).
    for my $q ('a=k1', 'A=k2', 'xa=k0&a=k3', 'a=k4&a=k5', 'ab=k0&A=k6&a=k7', 'a=&a=k8', '', 'a',
               'b=k0&ab=k1', '&&a=k9&', 'a=k1=2&b', 'a=%6B1', 'x=1&a=', 'a=k%26&a=z', 'Aa=1&aA=2&a=k10') {
        my $r = $n->get("/k?$q");
        is($r->{code}, 200, "/k?$q passes");
        my $arg = $r->{headers}{'x-arg'} // '';
        my $want = $arg eq '[]' ? '[]' : $arg =~ s/^\[/[a=/r;
        is($r->{headers}{'x-key'}, $want, "/k?$q: the module reads \$arg_a as nginx does ($arg)");
    }
    # `last`: the last item named w (any case) wins; `decode`: percent-decoded,
    # NUL refused (absent).
    for (['w=1&w=2', '[w=2]'], ['W=1&x=1&w=k2', '[w=k2]'], ['w=1&W=', '[]'], ['xw=1&wx=2', '[]'], ['w=k3', '[w=k3]'],
         ['', '[]']) {
        my ($q, $want) = @$_;
        is($n->get("/kw?$q")->{headers}{'x-key'}, $want, "last: /kw?$q");
    }
    for (['d=%6B%31', '[d=k1]'], ['d=k2', '[d=k2]'], ['D=k%33&d=x', '[d=k3]'], ['d=a%00', '[]'], ['d=', '[]']) {
        my ($q, $want) = @$_;
        is($n->get("/kd?$q")->{headers}{'x-key'}, $want, "decode: /kd?$q");
    }

    # The grid: every (a, b) pair its own strategy, 2 a day.
    is_deeply([$n->codes('/?a=a7&b=b29', 3)], [200, 200, 503], 'grid a7 b29: its own limit');
    is_deeply([$n->codes('/?B=b29&a=a7', 1)], [503], 'grid: the same pair in another order and case');
    is_deeply([$n->codes('/?a=a7&b=b28', 3)], [200, 200, 503], 'grid a7 b28: a separate limit');
    is_deeply([$n->codes('/?a=a7', 3)], [200, 200, 200], 'grid: a alone matches no cell');
    is_deeply([$n->codes('/?a=a30&b=b1', 3)], [200, 200, 200], 'grid: a value outside it passes');
    $n->no_alerts;
});

done_testing();
