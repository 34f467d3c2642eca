# The machine code of each built module: the 16-byte compare-and-swap
# (src/core/limiter/warm_up.rs, cas128) keeps its success flag out of rbx.
# cmpxchg16b takes its new low word in rbx, so the asm swaps it in and
# restores the caller's rbx right after; a flag set into bl before that
# restore is overwritten by it, and the caller then reads the low byte of
# whatever rbx held instead of the swap's result (main's module of
# 2026-11-23 did this in KeyTable::give_back: a dead worker's per-key units
# were given back, or not, by chance). Which register the compiler picks
# for such a flag changes with any edit of the code around the CAS, so this
# reads every site of the module nginx loads.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use RateCtlTest;

# Registers an instruction writes: its last AT&T operand.
sub writes_rbx {
    my ($ins) = @_;
    my ($op, $args) = $ins =~ /^\s*(\S+)\s*(.*)$/ or return 0;
    return 0 if $op =~ /^(cmp|test|push|jmp|j\w+|call|nop)/;
    my @ops = split /,/, $args;
    return @ops && $ops[-1] =~ /^%(bl|bh|bx|ebx|rbx)$/;
}

RateCtlTest::for_each_target(sub {
    my ($t) = @_;
    my @lines = `objdump -d --no-show-raw-insn "$t->{module}"`;
    is($?, 0, "objdump read $t->{module}");
    my ($sites, @bad) = (0);
    for my $i (0 .. $#lines) {
        next unless $lines[$i] =~ /\tlock cmpxchg16b/;
        $sites++;
        (my $at = $lines[$i]) =~ s/^\s+|\s+$//g;
        # Up to the instruction that restores rbx (mov %reg,%rbx), which
        # the asm puts within a few instructions: a site without it is a
        # finding too (the check would otherwise see nothing).
        my $restored = 0;
        for my $j ($i + 1 .. $i + 8) {
            last if $j > $#lines;
            my ($ins) = $lines[$j] =~ /^\s*[0-9a-f]+:\t(.*)$/ or last;
            if ($ins =~ /^mov\s+%\w+,%rbx$/) {
                $restored = 1;
                last;
            }
            if (writes_rbx($ins)) {
                push @bad, "$at: then $ins";
                $restored = 1;
                last;
            }
        }
        push @bad, "$at: no rbx restore within 8 instructions" unless $restored;
    }
    cmp_ok($sites, '>=', 2, "$t->{name}: the module has 16-byte CAS sites ($sites)");
    is_deeply(\@bad, [], "$t->{name}: no CAS result is written into rbx before rbx is restored")
        or diag(join("\n", @bad));
});

done_testing();
