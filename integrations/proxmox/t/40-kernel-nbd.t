# The kernel nbd path, where this machine's trireme node makes kernel nbd
# devices (its kernel has the nbd module): the plugin hands QEMU the
# volume's /dev/nbdN (through a stable link), `qm resize` of a running VM
# grows it, and a container's disk is that device with an ext4 on it.
#
# The machine the tests run on has no nbd module: there this test is
# skipped, and crates/cli/tests/kernel_nbd.rs runs it with perl inside a
# QEMU guest whose kernel has the module, against a trireme node running
# in that guest. "The VM" there is qemu-storage-daemon holding the disk
# open with the plugin's qemu_blockdev_options, as QEMU would (a full VM
# inside the TCG guest would take minutes); qemu-server's step after
# volume_resize, QMP `block_resize`, is sent to it.

use strict;
use warnings;

use IO::Socket::UNIX;
use JSON;
use POSIX qw(WNOHANG);
use Socket qw(SOCK_STREAM);
use Test::More;
use Time::HiRes qw(time sleep);
use TriremeTest;

use PVE::Storage::Custom::Trireme::Api qw(config_of);
use PVE::Storage::Custom::Trireme::Local qw(local_node);

my $plugin = plugin();
my ($here) = node_names();
my $on = scfg_on($here);
my $kind = local_node(config_of($on, 'tri'))->{device_kind};
plan(skip_all => "the trireme node here makes no kernel nbd devices (device_kind $kind: no nbd"
        . " module); crates/cli/tests/kernel_nbd.rs runs this test in a QEMU guest")
    if $kind ne 'kernel-nbd';

my $MIB = 1 << 20;
my $STATE_DIR = ($ENV{TRIREME_PVE_STATE_DIR} // '/run/trireme-pve') . '/tri';

sub device_bytes {
    my ($device) = @_;
    my $name = $device =~ s!^/dev/!!r;
    open(my $fh, '<', "/sys/block/$name/size") or return 0;
    my $sectors = <$fh>;
    return $sectors * 512;
}

sub write_through {
    my ($path, $offset, $data) = @_;
    open(my $fh, '+<', $path) or die "open $path: $!\n";
    sysseek($fh, $offset, 0) or die "seek $path: $!\n";
    syswrite($fh, $data) == length($data) or die "write $path: $!\n";
    close($fh) or die "close $path: $!\n";
    system('sync') == 0 or die "sync after writing $path failed\n";
}

# Reads from the device, not the page cache.
sub read_through {
    my ($path, $offset, $length) = @_;
    system('sync');
    if (open(my $drop, '>', '/proc/sys/vm/drop_caches')) {
        print $drop "3\n";
        close($drop);
    }
    open(my $fh, '<', $path) or die "open $path: $!\n";
    sysseek($fh, $offset, 0) or die "seek $path: $!\n";
    my $data = '';
    sysread($fh, $data, $length) == $length or die "read $path: $!\n";
    close($fh);
    return $data;
}

# One QMP command to a QEMU process; its answer ({return} or {error}).
sub qmp {
    my ($socket_path, $command, $arguments) = @_;
    my $socket = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $socket_path)
        or die "QMP $socket_path: $!\n";
    my $answer = sub {
        while (my $line = <$socket>) {
            my $message = decode_json($line);
            return $message if grep { exists $message->{$_} } qw(QMP return error);
        }
        die "QMP $socket_path closed\n";
    };
    $answer->();
    print $socket encode_json({ execute => 'qmp_capabilities' }), "\n";
    $answer->();
    print $socket encode_json({ execute => $command, $arguments ? (arguments => $arguments) : () })
        . "\n";
    my $reply = $answer->();
    close($socket);
    return $reply;
}

# "The VM": qemu-storage-daemon with the disk as qemu-server gives it
# (the plugin's options under a raw format node). Returns (pid, QMP path).
sub start_qemu {
    my ($options) = @_;
    my $qmp = "/tmp/qemu-$$.qmp";
    unlink($qmp);
    my $protocol = encode_json({ %$options, 'node-name' => 'proto0', cache => { direct => JSON::true } });
    my $pid = fork() // die "fork: $!\n";
    if (!$pid) {
        exec('qemu-storage-daemon', '--blockdev', $protocol,
            '--blockdev', 'raw,file=proto0,node-name=drive0',
            '--chardev', "socket,path=$qmp,server=on,wait=off,id=qmp0",
            '--monitor', 'chardev=qmp0');
        die "exec qemu-storage-daemon: $!\n";
    }
    my $deadline = time() + 20;
    sleep(0.1) while !-S $qmp && time() < $deadline && waitpid($pid, WNOHANG) == 0;
    return ($pid, $qmp);
}

sub virtual_size {
    my ($qmp, $node) = @_;
    my $nodes = qmp($qmp, 'query-named-block-nodes')->{return} // [];
    my ($found) = grep { $_->{'node-name'} eq $node } @$nodes;
    return $found ? $found->{image}{'virtual-size'} : undef;
}

# --- a VM's disk: the device, and growing it while the VM runs ---
my $disk = $plugin->alloc_image('tri', $on, 401, 'raw', undef, 64 * 1024);
ok($plugin->activate_volume('tri', $on, $disk), 'activate makes the kernel device');
my ($path) = $plugin->path($on, $disk, 'tri');
is($path, "$STATE_DIR/dev/$disk", "path is the stable link $path");
my $device = readlink($path) // '';
like($device, qr{^/dev/nbd\d+$}, "to the volume's kernel device $device");
ok(-b $path, 'which is a block device');
is_deeply($plugin->qemu_blockdev_options($on, 'tri', $disk),
    { driver => 'host_device', filename => $path }, 'qemu_blockdev_options: host_device on it');
write_through($path, 0, 'A' x $MIB);
is(read_through($path, 0, $MIB), 'A' x $MIB, 'data written through the device reads back');

my ($qemu, $qmp) = start_qemu($plugin->qemu_blockdev_options($on, 'tri', $disk));
ok(-S $qmp, "QEMU (qemu-storage-daemon) holds the disk open");
is(virtual_size($qmp, 'drive0'), 64 * $MIB, 'QEMU sees 64 MiB');
ok(eval { $plugin->volume_resize($on, 'tri', $disk, 128 * $MIB, 1) },
    'volume_resize of the running VM\'s disk (qm resize)') or diag($@);
is(device_bytes($device), 128 * $MIB, 'the device shows the new size when volume_resize returns');
my $resized = qmp($qmp, 'block_resize', { 'node-name' => 'drive0', size => 128 * $MIB });
ok(exists $resized->{return}, 'QEMU\'s block_resize (qemu-server\'s next step) takes it')
    or diag(encode_json($resized));
is(virtual_size($qmp, 'drive0'), 128 * $MIB, 'QEMU sees 128 MiB');
is(($plugin->volume_size_info($on, 'tri', $disk))[0], 128 * $MIB, 'the volume is 128 MiB');
write_through($path, 100 * $MIB, 'B' x $MIB);
is(read_through($path, 100 * $MIB, $MIB), 'B' x $MIB, 'past the old end, on the same device');
is(read_through($path, 0, $MIB), 'A' x $MIB, 'and what was written before is there');
ok(eval { $plugin->volume_resize($on, 'tri', $disk, 128 * $MIB, 1) },
    'resizing to the size it has changes nothing') or diag($@);
dies_like(sub { $plugin->volume_resize($on, 'tri', $disk, 96 * $MIB, 1) },
    [qr/is 128 MiB; it can only grow/], 'shrinking');
qmp($qmp, 'quit');
waitpid($qemu, 0);

ok($plugin->deactivate_volume('tri', $on, $disk), 'deactivate after the VM stopped');
ok(!-e $path && !-l $path, 'the link is gone');
my ($status) = api_get("/volumes/$disk/device");
is($status, 404, 'the node released the device');
is_deeply(primaries($disk), [], 'and detached the volume');
$plugin->free_image('tri', $on, $disk, 0);

# --- a container's root disk: map, ext4, mount, write, unmount, fsck ---
my $root = $plugin->alloc_image('tri', $on, 402, 'raw', undef, 64 * 1024);
my $mapped = $plugin->map_volume('tri', $on, $root);
like($mapped, qr{^/dev/nbd\d+$}, "map_volume gives the kernel device $mapped");
ok(-b $mapped, 'a block device');
is_deeply(primaries($root), [$here], 'attached here');
is(system("mkfs.ext4 -q -F $mapped >/tmp/mkfs.log 2>&1"), 0, 'mkfs.ext4 on it (as pct create)');
mkdir('/ct');
is(system("mount -t ext4 $mapped /ct"), 0, 'mounted as the container\'s root');
is(system('mkdir -p /ct/etc && echo ct402 >/ct/etc/hostname'
        . ' && dd if=/dev/urandom of=/ct/data bs=64k count=32 2>/dev/null && sync'
        . ' && cd /ct && sha256sum data etc/hostname >/tmp/ct.sums'), 0, 'written and synced');
dies_like(sub { $plugin->unmap_volume('tri', $on, $root) }, [qr{mounted at /ct}, qr/unmount/],
    'unmap_volume while it is mounted');
ok(-b $mapped && device_bytes($mapped) > 0, 'the device stays');
is(system('umount /ct'), 0, 'unmounted (the container stopped)');
is(system("e2fsck -f -n $mapped >/tmp/fsck.log 2>&1"), 0, 'e2fsck -f -n finds it clean')
    or diag(`cat /tmp/fsck.log`);
ok($plugin->unmap_volume('tri', $on, $root), 'unmap_volume');
ok($plugin->deactivate_volume('tri', $on, $root), 'deactivate');
is_deeply(primaries($root), [], 'detached');

my $again = $plugin->map_volume('tri', $on, $root);
ok(-b $again, "the container's next start maps it again ($again)");
is(system("mount -t ext4 $again /ct && cd /ct && sha256sum -c /tmp/ct.sums >/tmp/ct.check 2>&1"),
    0, 'every file reads back with its checksum') or diag(`cat /tmp/ct.check`);
is(system('umount /ct'), 0, 'unmounted');
ok($plugin->unmap_volume('tri', $on, $root) && $plugin->deactivate_volume('tri', $on, $root),
    'unmapped and deactivated');
dies_like(sub { $plugin->map_volume('tri', $on, $root, 'snap') },
    [qr/snapshots cannot be mapped/], 'a snapshot');
$plugin->free_image('tri', $on, $root, 0);
ok(!defined(primaries($root)), 'freed');

done_testing();
