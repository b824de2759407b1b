package PVE::Storage::Custom::Trireme::Local;

# What the trireme storage plugin knows of this machine: its trireme node
# (name and NBD unix socket, remembered for when no API answers), the
# volumes it attached, and whether the local socket serves a volume. Part
# of the trireme Proxmox VE plugin (Apache-2.0).

use strict;
use warnings;

use Exporter qw(import);
use File::Path qw(make_path);
use IO::Socket::UNIX;
use JSON;
use Socket qw(SOCK_STREAM);
use Time::HiRes qw(time sleep);

use PVE::Storage::Custom::Trireme::Api qw(request);

our @EXPORT_OK = qw(
    state_dir local_node socket_of is_primary_on attached_marker write_file read_file
    socket_alive wait_served
);

sub state_dir {
    my ($config) = @_;
    my $dir = ($ENV{TRIREME_PVE_STATE_DIR} // '/run/trireme-pve') . "/$config->{storeid}";
    make_path($dir) if !-d $dir;
    return $dir;
}

# This Proxmox node's trireme node: { node_name, nbd_unix_socket,
# device_kind }, from its local API, remembered for when no API answers.
# device_kind is how it makes a volume's block device on this host:
# `kernel-nbd` where the kernel has the nbd module, else `nbdfuse-loop`
# (absent from a node older than the field: taken as no kernel device).
sub local_node {
    my ($config) = @_;
    my $cache = state_dir($config) . '/local-node.json';
    my ($status, $answer) = eval {
        request($config, 'GET', '/node', undef, addresses => [$config->{local_api}], budget => 4);
    };
    if (defined($status) && $status == 200 && ref($answer) eq 'HASH' && $answer->{node_name}) {
        my $node = {
            node_name => $answer->{node_name},
            nbd_unix_socket => $answer->{nbd_unix_socket},
            device_kind => $answer->{device_kind} // 'none',
        };
        write_file($cache, encode_json($node));
        return $node;
    }
    my $error = $@ || "HTTP " . ($status // '?');
    my $remembered = eval { decode_json(read_file($cache)) };
    return $remembered if $remembered && $remembered->{node_name};
    die "trireme storage '$config->{storeid}': the trireme node of this machine does not"
        . " answer at $config->{local_api} (set `local-api` if it listens elsewhere): $error";
}

sub socket_of {
    my ($config) = @_;
    my $socket = local_node($config)->{nbd_unix_socket};
    die "trireme storage '$config->{storeid}': the local trireme node serves no NBD unix socket"
        . " (start it without --nbd-socket '')\n"
        if !$socket;
    return $socket;
}

sub is_primary_on {
    my ($info, $node) = @_;
    return scalar(grep { $_ eq $node } @{ $info->{primaries} // [] });
}

sub attached_marker {
    my ($config, $volume) = @_;
    return state_dir($config) . "/attached-$volume";
}

sub write_file {
    my ($path, $content) = @_;
    my $temporary = "$path.tmp.$$";
    open(my $fh, '>', $temporary) or die "trireme: cannot write $temporary: $!\n";
    print $fh $content;
    close($fh) or die "trireme: cannot write $temporary: $!\n";
    rename($temporary, $path) or die "trireme: cannot rename $temporary: $!\n";
}

sub read_file {
    my ($path) = @_;
    open(my $fh, '<', $path) or return undef;
    local $/;
    my $content = <$fh>;
    close($fh);
    return $content;
}

# Whether something listens on the local NBD socket (the node runs).
sub socket_alive {
    my ($path) = @_;
    return 0 if !defined($path) || !-S $path;
    my $socket = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $path);
    return 0 if !$socket;
    close($socket);
    return 1;
}

# The engine starts a moment after the attach commits: wait (briefly)
# until the local socket serves the volume, so QEMU's first open works.
sub wait_served {
    my ($config, $volume) = @_;
    my $socket = socket_of($config);
    my $deadline = time() + 10;
    while (time() < $deadline) {
        return 1 if nbd_export_opens($socket, $volume);
        sleep(0.1);
    }
    die "trireme: '$volume' is attached here but the local NBD socket $socket does not serve"
        . " it after 10 s; see the trireme node's log\n";
}

# A minimal NBD handshake (fixed newstyle, NBD_OPT_GO): whether the export
# opens.
sub nbd_export_opens {
    my ($path, $name) = @_;
    my $socket = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $path) or return 0;
    $socket->timeout(5);
    my $ok = eval {
        my $greeting = read_exact($socket, 18);
        my (undef, undef, $flags) = unpack('a8 a8 n', $greeting);
        print $socket pack('N', $flags & 0x3);
        # NBD_OPT_GO (7) with the name and no information requests.
        my $data = pack('N', length($name)) . $name . pack('n', 0);
        print $socket pack('a8 N N', 'IHAVEOPT', 7, length($data)) . $data;
        while (1) {
            my ($magic, $option, $type, $length) = unpack('a8 N N N', read_exact($socket, 20));
            read_exact($socket, $length) if $length;
            return 1 if $type == 1;              # NBD_REP_ACK
            return 0 if $type & 0x80000000;      # an error reply
        }
    };
    # Leave politely: NBD_OPT_ABORT is not possible after GO; closing is.
    close($socket);
    return $ok ? 1 : 0;
}

sub read_exact {
    my ($socket, $length) = @_;
    my $buffer = '';
    while (length($buffer) < $length) {
        my $read = sysread($socket, $buffer, $length - length($buffer), length($buffer));
        die "short read\n" if !$read;
    }
    return $buffer;
}

1;
