# The plugin driven the way PVE::Storage drives it, against the real
# three-node trireme cluster the cargo test started: alloc -> activate ->
# path -> snapshot -> clone -> resize -> a live migration's double
# activation -> deactivate -> free, with data read and written through what
# path()/qemu_blockdev_options() give QEMU.

use strict;
use warnings;

use Test::More;
use TriremeTest;

my $plugin = plugin();
my ($n1, $n2, $n3) = node_names();
my $on1 = scfg_on($n1);
my $on2 = scfg_on($n2);
my $MIB_KIB = 1024;
my $qemu = have_qemu_io();
if (!$qemu) {
    BAIL_OUT('qemu-io is missing (CI installs qemu-utils)') if $ENV{CI} && $ENV{CI} ne 'false';
    diag('qemu-io is missing: data checks are skipped');
}

sub io_ok {
    my ($target, $commands, $name) = @_;
    SKIP: {
        skip 'no qemu-io', 1 if !$qemu;
        my ($ok, $output) = qemu_io($target, @$commands);
        ok($ok, $name) or diag($output);
    }
}

my $apiver = $plugin->api();
ok($apiver >= 11 && $apiver <= 15, "plugin API version $apiver is one of PVE 8 and 9");
is($plugin->type(), 'trireme', 'storage type');

# --- alloc, list, status ---
my $disk = $plugin->alloc_image('tri', $on1, 101, 'raw', undef, 64 * $MIB_KIB);
is($disk, 'vm-101-disk-0', 'the first disk of VM 101');
my $second = $plugin->alloc_image('tri', $on1, 101, undef, undef, 10);
is($second, 'vm-101-disk-1', 'the next free name');
my ($size, $format) = $plugin->volume_size_info($on1, 'tri', $second);
is($size, 12288, '10 KiB rounds up to whole 4 KiB blocks');
is($format, 'raw', 'raw');
my $named = $plugin->alloc_image('tri', $on1, 101, 'raw', 'vm-101-state-before', 4 * $MIB_KIB);
is($named, 'vm-101-state-before', 'a name Proxmox gives (a RAM state volume)');

my $listed = $plugin->list_images('tri', $on1, 101);
is_deeply([sort map { $_->{volid} } @$listed],
    ['tri:vm-101-disk-0', 'tri:vm-101-disk-1', 'tri:vm-101-state-before'], 'list_images of VM 101');
my ($image) = grep { $_->{volid} eq 'tri:vm-101-disk-0' } @$listed;
is($image->{size}, 64 << 20, 'its size');
is($image->{vmid}, 101, 'its owner');
is_deeply($plugin->list_images('tri', $on1, undef, ['tri:vm-101-disk-1']),
    [grep { $_->{volid} eq 'tri:vm-101-disk-1' } @$listed], 'list_images of a volume list');

my ($total, $free, $used, $active) = $plugin->status('tri', $on1);
ok($active && $total > 0 && $free > 0 && $free <= $total, "status: $free of $total bytes free");

# --- the node makes no kernel nbd devices here: QEMU gets the NBD socket ---
my $kind = PVE::Storage::Custom::Trireme::Local::local_node(
    PVE::Storage::Custom::Trireme::Api::config_of($on1, 'tri'))->{device_kind};
BAIL_OUT("n1 makes '$kind' devices: this test covers the NBD socket path; t/40-kernel-nbd.t"
        . ' the kernel one')
    if $kind eq 'kernel-nbd';
is($kind, 'nbdfuse-loop', 'the node says how it makes devices (no kernel nbd here)');
dies_like(sub { $plugin->map_volume('tri', $on1, $disk) },
    [qr/makes no kernel nbd devices/, qr/modprobe nbd/, qr/container/],
    'a container\'s disk (map_volume) without kernel nbd');
is_deeply(primaries($disk), [], 'and nothing was attached');
ok($plugin->unmap_volume('tri', $on1, $disk), 'unmap_volume of what was never mapped is fine');

# --- activate on n1, path, blockdev options, data ---
ok($plugin->activate_volume('tri', $on1, $disk), 'activate on n1');
is_deeply(primaries($disk), [$n1], 'n1 is its primary');
ok($plugin->activate_volume('tri', $on1, $disk), 'activating again changes nothing');
is_deeply(primaries($disk), [$n1], 'still n1 alone');

my ($path, $vmid, $vtype) = $plugin->path($on1, $disk, 'tri');
like($path, qr{^nbd:unix:/\S+:exportname=vm-101-disk-0$}, "path: $path");
is($vmid, 101, 'path gives the VM id');
my $blockdev = $plugin->qemu_blockdev_options($on1, 'tri', $disk);
is($blockdev->{driver}, 'nbd', 'blockdev driver nbd');
is($blockdev->{server}{type}, 'unix', 'over the local unix socket');
is($blockdev->{export}, $disk, 'export name');
my ($socket) = $path =~ m{^nbd:unix:(\S+):exportname=};
is($blockdev->{server}{path}, $socket, 'the same socket as path');
io_ok($blockdev, ['write -P 0x42 0 1M', 'flush'], 'QEMU writes through the blockdev options');
io_ok($path, ['read -P 0x42 0 1M'], 'and reads it back through the path');

# --- snapshots ---
ok($plugin->volume_has_feature($on1, 'snapshot', 'tri', $disk), 'snapshots are a feature');
ok($plugin->volume_has_feature($on1, 'clone', 'tri', $disk, 'snap1'), 'clones of snapshots');
ok(!$plugin->volume_has_feature($on1, 'clone', 'tri', $disk), 'no clone of a current disk');
$plugin->volume_snapshot($on1, 'tri', $disk, 'snap1');
my $snapshots = $plugin->volume_snapshot_info($on1, 'tri', $disk);
is_deeply([sort keys %$snapshots], ['snap1'], 'volume_snapshot_info lists snap1');
ok($snapshots->{snap1}{timestamp} > 1_600_000_000, 'with its time');
io_ok($blockdev, ['write -P 0x43 0 1M', 'flush'], 'written after the snapshot');
my $snapshot_blockdev = $plugin->qemu_blockdev_options($on1, 'tri', $disk, undef,
    { 'snapshot-name' => 'snap1' });
is($snapshot_blockdev->{export}, "$disk\@snap1", 'a snapshot is its read-only export');
io_ok({ %$snapshot_blockdev, '-r' => 1 }, ['read -P 0x42 0 1M'], 'the snapshot reads as it was (read-only)');

# --- clone of a snapshot ---
my $clone = $plugin->clone_image($on1, 'tri', $disk, 102, 'snap1');
is($clone, 'vm-102-disk-0', 'a clone for VM 102');
ok($plugin->activate_volume('tri', $on1, $clone), 'activate the clone');
my $clone_blockdev = $plugin->qemu_blockdev_options($on1, 'tri', $clone);
io_ok($clone_blockdev, ['read -P 0x42 0 1M'], 'the clone holds the snapshot content');

# --- rollback (before the resize: a grown volume cannot go back) ---
ok($plugin->volume_rollback_is_possible($on1, 'tri', $disk, 'snap1'), 'rollback possible');
$plugin->volume_snapshot_rollback($on1, 'tri', $disk, 'snap1');
ok($plugin->activate_volume('tri', $on1, $disk), 'activate after the rollback');
io_ok($blockdev, ['read -P 0x42 0 1M'], 'the rolled-back disk reads as the snapshot');

# --- resize ---
# The fallback where the node makes no kernel nbd devices (as here: no nbd
# module; t/40-kernel-nbd.t covers the kernel path, in a QEMU guest).
eval { $plugin->volume_resize($on1, 'tri', $disk, 128 << 20, 1) };
like($@, qr/while its VM runs.*makes no kernel nbd devices.*modprobe nbd.*NBD client/s,
    'a running VM\'s disk on the NBD socket is not grown, and the message says what would');
is(($plugin->volume_size_info($on1, 'tri', $disk))[0], 64 << 20, 'and nothing changed');
ok($plugin->volume_resize($on1, 'tri', $disk, 128 << 20, 0), 'grown with the VM stopped');
is(($plugin->volume_size_info($on1, 'tri', $disk))[0], 128 << 20, 'the new size');
is_deeply(primaries($disk), [$n1], 'attached on n1 again');
io_ok($blockdev, ['read -P 0x42 0 1M', 'write -P 0x44 100M 1M', 'read -P 0x44 100M 1M'],
    'the grown disk keeps its data and takes writes past the old end');

# --- template and linked clone ---
ok($plugin->deactivate_volume('tri', $on1, $clone), 'deactivate the clone');
my $base = $plugin->create_base('tri', $on1, $clone);
is($base, 'base-102-disk-0', 'create_base makes the template disk');
ok(!grep({ $_->{volid} eq "tri:$clone" } @{ $plugin->list_images('tri', $on1, 102) }),
    'the disk became the template');
ok($plugin->volume_has_feature($on1, 'clone', 'tri', $base), 'a template can be cloned');
my $linked = $plugin->clone_image($on1, 'tri', $base, 103);
is($linked, 'vm-103-disk-0', 'a linked clone for VM 103');
ok($plugin->activate_volume('tri', $on1, "$base/$linked"), 'activated by its base/ name');
io_ok($plugin->qemu_blockdev_options($on1, 'tri', "$base/$linked"), ['read -P 0x42 0 1M'],
    'the linked clone reads as the template');

# --- rename (a disk reassigned to another VM) ---
my $renamed = $plugin->rename_volume($on1, 'tri', $second, 104);
is($renamed, 'tri:vm-104-disk-0', 'renamed for VM 104');
ok(!defined(primaries($second)), 'the old name is gone');

# --- live migration n1 -> n2: the double activation ---
{
    local $ENV{PVE_MIGRATED_FROM} = $n1;
    ok($plugin->activate_volume('tri', $on2, $disk), 'the migration target activates too');
}
is_deeply(primaries($disk), [sort($n1, $n2)], 'two primaries while the VM moves');
my $on2_blockdev = $plugin->qemu_blockdev_options($on2, 'tri', $disk);
isnt($on2_blockdev->{server}{path}, $socket, "n2's own socket");
io_ok($on2_blockdev, ['read -P 0x42 0 1M', 'write -P 0x45 2M 1M', 'flush'],
    'the target reads and writes');
ok($plugin->deactivate_volume('tri', $on1, $disk), 'the source deactivates after the move');
is_deeply(primaries($disk), [$n2], 'n2 alone serves it');
io_ok($on2_blockdev, ['read -P 0x42 0 1M', 'read -P 0x45 2M 1M'], 'every write is there');
ok($plugin->deactivate_volume('tri', $on1, $disk), 'deactivating where it is not attached is fine');

# --- deactivate and free everything ---
ok($plugin->deactivate_volume('tri', $on2, $disk), 'deactivate on n2');
is_deeply(primaries($disk), [], 'detached');
for my $volname ($disk, "$base/$linked", $base, 'vm-104-disk-0', $named) {
    my $owner = ($plugin->parse_volname($volname))[2];
    $plugin->deactivate_volume('tri', $on1, $volname);
    $plugin->free_image('tri', $on1, $volname, 0);
    ok(!defined(primaries($plugin->volume_of($volname))), "freed $volname");
}
is_deeply($plugin->list_images('tri', $on1, 101), [], 'VM 101 has no disks left');

done_testing();
