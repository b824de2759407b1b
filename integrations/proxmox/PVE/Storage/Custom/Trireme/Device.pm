package PVE::Storage::Custom::Trireme::Device;

# Kernel nbd devices for QEMU and containers: where this machine's trireme
# node makes a volume's block device with the kernel's nbd module
# (`device_kind: kernel-nbd`, `PUT /api/v1/volumes/NAME/device` on the
# node's own API, made over netlink), the plugin hands QEMU that
# `/dev/nbdN` instead of the node's NBD socket. The node grows such a
# device in place when its volume grows (NBD_CMD_RECONFIGURE), so a
# running VM's disk can grow (`qm resize`: the device first, then QEMU's
# block_resize), as linstor-proxmox does with /dev/drbdN; and a container's
# root disk is a block device at all. Where the node makes no kernel device
# (no nbd module), QEMU keeps the NBD socket. Part of the trireme Proxmox
# VE plugin (Apache-2.0).
#
# QEMU is given a stable name, STATE_DIR/dev/VOLUME, a symlink to the
# device made at activation: qemu-server builds QEMU's command line (path,
# qemu_blockdev_options) before it activates the volumes, and N is only
# known once the node made the device.

use strict;
use warnings;

use Exporter qw(import);
use File::Path qw(make_path);
use Time::HiRes qw(time sleep);

use PVE::Storage::Custom::Trireme::Api qw(request);
use PVE::Storage::Custom::Trireme::Local qw(state_dir local_node);

our @EXPORT_OK = qw(
    kernel_devices_here device_link make_device device_of release_device grow_device_to
    human_size
);

# How long a device request waits for the node to serve a volume it was
# just attached (the agent applies an attach a moment after its commit).
our $NOT_SERVED_WAIT_SECONDS = 10;
# How long volume_resize waits for the device to show the new size: the
# volume's engine takes it once every replica in sync has grown its copy.
our $GROW_WAIT_SECONDS = 30;

# Whether this machine's trireme node makes kernel nbd devices.
sub kernel_devices_here {
    my ($config) = @_;
    return (local_node($config)->{device_kind} // '') eq 'kernel-nbd' ? 1 : 0;
}

# The stable name QEMU is given: a symlink to the volume's /dev/nbdN.
sub device_link {
    my ($config, $volume) = @_;
    return state_dir($config) . "/dev/$volume";
}

# One request to this machine's own node (devices are made by the node
# that answers, on its host). Returns ($status, $answer).
sub local_request {
    my ($config, $method, $path, $body) = @_;
    return request($config, $method, $path, $body, addresses => [$config->{local_api}]);
}

sub error_of {
    my ($status, $answer) = @_;
    return ref($answer) eq 'HASH' && $answer->{error} ? $answer->{error} : "HTTP $status";
}

# Makes (or finds) the volume's kernel device on this host, points the
# stable link at it and returns the node's answer ({ device, size_bytes,
# kind }). Retries while the node does not serve the volume yet.
sub make_device {
    my ($config, $volume) = @_;
    my $here = local_node($config)->{node_name};
    my $deadline = time() + $NOT_SERVED_WAIT_SECONDS;
    my ($status, $answer);
    while (1) {
        ($status, $answer) = local_request($config, 'PUT', "/volumes/$volume/device",
            { node => $here });
        last if $status == 200;
        my $code = ref($answer) eq 'HASH' ? $answer->{code} // '' : '';
        last if $code ne 'not_served' || time() > $deadline;
        sleep(0.2);
    }
    die "trireme: no kernel nbd device for '$volume' on this node ($here): "
        . error_of($status, $answer) . "\n"
        if $status != 200;
    if (($answer->{kind} // '') ne 'kernel-nbd') {
        local_request($config, 'DELETE', "/volumes/$volume/device");
        die "trireme: the trireme node of this machine ($here) made a '$answer->{kind}' device"
            . " for '$volume', not a kernel nbd one (was it restarted without the nbd module?);"
            . " stop and start the VM to use its NBD socket instead\n";
    }
    die "trireme: the node answered $answer->{device} for '$volume', which is no block device\n"
        if !-b $answer->{device};
    point_link(device_link($config, $volume), $answer->{device});
    return $answer;
}

# Replaces the link atomically (a rename over the old one).
sub point_link {
    my ($link, $device) = @_;
    my $dir = $link =~ s!/[^/]*$!!r;
    make_path($dir) if !-d $dir;
    my $temporary = "$link.tmp.$$";
    unlink($temporary);
    symlink($device, $temporary) or die "trireme: cannot link $temporary to $device: $!\n";
    rename($temporary, $link) or die "trireme: cannot rename $temporary to $link: $!\n";
}

# The volume's device on this host as the node knows it, or undef.
sub device_of {
    my ($config, $volume) = @_;
    my ($status, $answer) = local_request($config, 'GET', "/volumes/$volume/device");
    return $answer if $status == 200;
    return undef if $status == 404;
    die "trireme: cannot ask this node about the device of '$volume': "
        . error_of($status, $answer) . "\n";
}

# Gives the device back to the node (refused while it is mounted) and
# removes the link. Nothing to do when there is none.
sub release_device {
    my ($config, $volume) = @_;
    my ($status, $answer) = local_request($config, 'DELETE', "/volumes/$volume/device");
    die "trireme: cannot release the device of '$volume': " . error_of($status, $answer) . "\n"
        if $status != 204 && $status != 404;
    unlink(device_link($config, $volume));
    return 1;
}

# Waits until the volume's device shows at least `bytes`: the node grows
# it once its engine serves the new size, and a PUT asks it to look at
# once. QEMU's block_resize of a host device fails while the device is
# smaller, so volume_resize returns only after this.
sub grow_device_to {
    my ($config, $volume, $bytes) = @_;
    my $deadline = time() + $GROW_WAIT_SECONDS;
    my $device;
    while (1) {
        $device = make_device($config, $volume);
        return $device if $device->{size_bytes} >= $bytes;
        last if time() > $deadline;
        sleep(0.2);
    }
    die "trireme: '$volume' grew to " . human_size($bytes) . ", but its device"
        . " $device->{device} still shows " . human_size($device->{size_bytes})
        . " after $GROW_WAIT_SECONDS s (a replica that cannot grow its copy"
        . " holds the volume's engine at the old size: see `trireme volume show $volume` and the"
        . " node's log); the VM keeps the old size until then\n";
}

# Bytes as a person reads them: `64 MiB`, `1.5 GiB`, `12 KiB`.
sub human_size {
    my ($bytes) = @_;
    my @units = ('bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB');
    my $unit = 0;
    my $value = $bytes;
    while ($value >= 1024 && $unit < $#units) {
        $value /= 1024;
        $unit++;
    }
    return "$bytes bytes" if $unit == 0;
    my $text = sprintf('%.1f', $value) =~ s/\.0$//r;
    return "$text $units[$unit]";
}

1;
