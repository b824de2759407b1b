# Proxmox HA after a machine died: the VM's disk was activated on the node
# named in TRIREME_TEST_HA_FROM; the cargo test killed that node's trireme
# (kill -9) between the `prepare` and `takeover` phases
# (TRIREME_TEST_HA_PHASE). Activating on another node takes the disk over in
# one call once the cluster counts the dead node offline (retried, as a
# start would be, for at most 10 s), says so, and every write is there.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);
use TriremeTest;

my $plugin = plugin();
my $phase = $ENV{TRIREME_TEST_HA_PHASE} // '';
my $from = $ENV{TRIREME_TEST_HA_FROM} // plan(skip_all => 'run by the cargo test, in two phases');
my ($to) = grep { $_ ne $from } node_names();
my $disk = 'vm-301-disk-0';

if ($phase eq 'prepare') {
    my $scfg = scfg_on($from);
    is($plugin->alloc_image('tri', $scfg, 301, 'raw', undef, 16 * 1024), $disk, 'a disk for VM 301');
    ok($plugin->activate_volume('tri', $scfg, $disk), "the VM runs on $from");
    SKIP: {
        skip 'no qemu-io', 1 if !have_qemu_io();
        my ($ok, $output) = qemu_io($plugin->qemu_blockdev_options($scfg, 'tri', $disk),
            'write -P 0x5c 0 4M', 'flush');
        ok($ok, 'the VM wrote and flushed') or diag($output);
    }
} elsif ($phase eq 'takeover') {
    my $scfg = scfg_on($to);
    my $killed_at = $ENV{TRIREME_TEST_HA_KILLED_AT} // time();
    my ($warned, $error, $attempts, $activated) = ('', '', 0, 0);
    while (1) {
        $attempts++;
        local $SIG{__WARN__} = sub { $warned .= $_[0] };
        if (eval { $plugin->activate_volume('tri', $scfg, $disk); 1 }) {
            $activated = 1;
            last;
        }
        $error = $@;
        like($error, qr/still counts as online/, 'a refusal before the node is offline says so')
            if $attempts == 1;
        last if time() - $killed_at > 15;
        sleep(0.2);
    }
    my $took = time() - $killed_at;
    ok($activated, "activated on $to") or diag("last error: $error");
    ok($took <= 10, sprintf('%.1f s from the kill to the activation (at most 10 s)', $took));
    diag(sprintf('HA takeover through the plugin: %.1f s after kill -9, %d attempts', $took,
        $attempts));
    like($warned, qr/took '\Q$disk\E' over from node '\Q$from\E' \(offline\).*do not start this VM there again/s,
        'the takeover is reported');
    is_deeply(primaries($disk), [$to], "$to alone serves it");
    SKIP: {
        skip 'no qemu-io', 1 if !have_qemu_io();
        my ($ok, $output) = qemu_io($plugin->qemu_blockdev_options($scfg, 'tri', $disk),
            'read -P 0x5c 0 4M');
        ok($ok, 'every flushed write is there') or diag($output);
    }
    ok($plugin->deactivate_volume('tri', $scfg, $disk), 'deactivate');
    my $started = time();
    {
        local $SIG{__WARN__} = sub { note($_[0]) };
        $plugin->free_image('tri', $scfg, $disk, 0);
    }
    ok(time() - $started < 10, 'freeing with a replica\'s node down does not hang');
    my ($status, $info) = api_get("/volumes/$disk");
    ok($status == 404 || $info->{state} eq 'deleting',
        "freed (its copy on $from goes when $from is back)");
} else {
    plan(skip_all => 'TRIREME_TEST_HA_PHASE is prepare or takeover');
}

done_testing();
