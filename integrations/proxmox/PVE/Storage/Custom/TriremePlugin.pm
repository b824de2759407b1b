package PVE::Storage::Custom::TriremePlugin;

# Proxmox VE storage plugin for trireme: replicated block volumes that QEMU
# reaches through the local trireme node: a kernel nbd device (/dev/nbdN)
# where the node makes them, else over NBD through the node's unix socket.
#
# Copyright the trireme authors. Licensed under the Apache License 2.0.
#
# How it maps Proxmox's storage operations onto trireme's REST API:
# - a disk `vm-101-disk-0` is the trireme volume of that name; linked clones
#   (`base-100-disk-0/vm-101-disk-0`) are volumes of their own that share
#   chunks with the template (no chain: the template can go first);
# - activate_volume attaches the volume on this node (its primary), as a
#   second primary while a VM migrates here (PVE_MIGRATED_FROM is set by
#   qemu-server), taking it over from a node the cluster marked offline
#   otherwise; deactivate_volume detaches it from this node;
# - path / qemu_blockdev_options give QEMU the volume's kernel nbd device
#   where this machine's trireme node makes them (the kernel has the nbd
#   module; Trireme/Device.pm), which grows while the VM runs; else the
#   local NBD unix socket, whose client in QEMU never sees a new size.
#
# Only modules Proxmox VE ships are used (JSON, HTTP::Tiny, core modules).

use strict;
use warnings;

use JSON;
use POSIX qw(ceil);
use Time::HiRes qw(time sleep);

use PVE::Storage::Plugin;
use PVE::Storage::Custom::Trireme::Api qw(config_of request call volume_info existing_volume);
use PVE::Storage::Custom::Trireme::Local qw(
    state_dir local_node socket_of is_primary_on attached_marker write_file read_file
    socket_alive wait_served
);
use PVE::Storage::Custom::Trireme::Device qw(
    kernel_devices_here device_link make_device device_of release_device grow_device_to
    human_size
);
use base qw(PVE::Storage::Plugin);

# QEMU waits this long for the NBD server to come back (a trireme node
# restarting, e.g. for an upgrade) before failing I/O.
our $NBD_RECONNECT_DELAY_SECONDS = 10;
# trireme sizes are multiples of this.
my $BLOCK_BYTES = 4096;
# The snapshot create_base takes; the dot keeps it apart from Proxmox's own
# snapshot names, which cannot hold one.
my $BASE_SNAPSHOT = 'base.template';
# Proxmox VE 8.4 (API 11) and 9 (12 to 15) work with this plugin.
my $TESTED_APIVER = 15;

# The storage API version Proxmox asks for, up to the newest this plugin
# knows (a newer Proxmox accepts it while within its APIAGE).
sub api {
    my $apiver = eval { PVE::Storage::APIVER() } // 11;
    return $apiver <= $TESTED_APIVER ? $apiver : $TESTED_APIVER;
}

sub type { return 'trireme'; }

sub plugindata {
    return {
        content => [{ images => 1, rootdir => 1 }, { images => 1 }],
        'sensitive-properties' => { token => 1 },
    };
}

sub properties {
    return {
        api => {
            description => "trireme REST API addresses, tried in turn"
                . " (e.g. http://pve1:7450,http://pve2:7450).",
            type => 'string',
        },
        token => {
            description => "trireme admin token (DATA/admin.token of any node).",
            type => 'string',
        },
        'local-api' => {
            description => "REST API of the trireme node on each Proxmox node"
                . " [default: $PVE::Storage::Custom::Trireme::Api::DEFAULT_LOCAL_API].",
            type => 'string',
        },
        group => {
            description => "trireme resource group for new volumes [default: default].",
            type => 'string',
        },
        replicas => {
            description => "Diskful replicas per new volume [default: the group's].",
            type => 'integer',
            minimum => 1,
            maximum => 8,
        },
    };
}

sub options {
    return {
        api => { optional => 0 },
        token => { optional => 0 },
        'local-api' => { optional => 1 },
        group => { optional => 1 },
        replicas => { optional => 1 },
        shared => { optional => 1 },
        content => { optional => 1 },
        nodes => { optional => 1 },
        disable => { optional => 1 },
        bwlimit => { optional => 1 },
    };
}

# --- names -----------------------------------------------------------------

# `vm-101-disk-0`, `base-100-disk-0`, `base-100-disk-0/vm-101-disk-0`, also
# `vm-101-cloudinit` and `vm-101-state-NAME`: what Proxmox makes. Anything
# else, and any name trireme would refuse, is refused here.
sub parse_volname {
    my ($class, $volname) = @_;
    die "trireme: no volume name given\n" if !defined($volname) || $volname eq '';
    if ($volname =~ m!\A(?:(base-(\d+)-[A-Za-z0-9][A-Za-z0-9_.-]*)/)?((base|vm)-(\d+)-([A-Za-z0-9][A-Za-z0-9_.-]*))\z!
        && length($3) <= 63)
    {
        my ($basename, $basevmid, $name, $kind, $vmid) = ($1, $2, $3, $4, $5);
        my $is_base = $kind eq 'base' ? 1 : 0;
        return ('images', $name, $vmid, $basename, $basevmid, $is_base, 'raw');
    }
    die "trireme: '$volname' is not a volume name Proxmox makes"
        . " (vm-VMID-disk-N, base-VMID-disk-N, or base-.../vm-...)\n";
}

# The trireme volume of a Proxmox volume name.
sub volume_of {
    my ($class, $volname) = @_;
    return ($class->parse_volname($volname))[1];
}

sub check_snapshot_name {
    my ($snapshot) = @_;
    die "trireme: '$snapshot' is not a snapshot name Proxmox makes\n"
        if $snapshot !~ m/\A[A-Za-z][A-Za-z0-9_.-]{0,62}\z/;
    return $snapshot;
}

# --- volumes -----------------------------------------------------------------

sub size_bytes_of_kib {
    my ($kib) = @_;
    my $bytes = $kib * 1024;
    return ceil($bytes / $BLOCK_BYTES) * $BLOCK_BYTES;
}

sub list_volumes_named {
    my ($config) = @_;
    my $volumes = call($config, 'GET', '/volumes');
    return [grep { $_->{name} =~ m/^(?:vm|base)-\d+-/ } @$volumes];
}

sub find_free_diskname {
    my ($class, $storeid, $scfg, $vmid, $fmt, $add_fmt_suffix) = @_;
    my $config = config_of($scfg, $storeid);
    my @names = map { $_->{name} } @{ list_volumes_named($config) };
    return PVE::Storage::Plugin::get_next_vm_diskname(\@names, $storeid, $vmid, undef, $scfg);
}

sub alloc_image {
    my ($class, $storeid, $scfg, $vmid, $fmt, $name, $size_kib) = @_;
    my $config = config_of($scfg, $storeid);
    die "trireme: volumes are raw block devices; format '$fmt' is not possible\n"
        if defined($fmt) && $fmt ne '' && $fmt ne 'raw';
    die "trireme: VM id '$vmid' is not a number\n" if !defined($vmid) || $vmid !~ m/^\d+$/;
    if (defined($name) && $name ne '') {
        die "trireme: illegal name '$name' - should be 'vm-$vmid-*'\n" if $name !~ m/^vm-$vmid-/;
        $class->parse_volname($name);
    } else {
        $name = $class->find_free_diskname($storeid, $scfg, $vmid);
    }
    die "trireme: size '$size_kib' KiB is not a positive number\n"
        if !defined($size_kib) || $size_kib !~ m/^\d+$/ || $size_kib == 0;
    my $request = { name => $name, size_bytes => size_bytes_of_kib($size_kib) };
    $request->{group} = $scfg->{group} if $scfg->{group};
    $request->{replicas} = int($scfg->{replicas}) if $scfg->{replicas};
    call($config, 'POST', '/volumes', $request);
    return $name;
}

# Detaches from this node if it is a primary here; refuses when a live node
# other than this one serves the volume (a running VM elsewhere).
sub detach_here_or_refuse {
    my ($config, $info, $what) = @_;
    my $here = local_node($config)->{node_name};
    my @elsewhere = grep { $_ ne $here } @{ $info->{primaries} // [] };
    die "trireme: cannot $what '$info->{name}': it is attached on @elsewhere (a VM runs"
        . " there?); stop it there first\n"
        if @elsewhere;
    if (is_primary_on($info, $here)) {
        call($config, 'POST', "/volumes/$info->{name}/detach", { node => $here });
        unlink(attached_marker($config, $info->{name}));
    }
}

sub free_image {
    my ($class, $storeid, $scfg, $volname, $isBase, $format) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    my $info = existing_volume($config, $volume);
    detach_here_or_refuse($config, $info, 'delete');
    my $snapshots = call($config, 'GET', "/volumes/$volume/snapshots");
    for my $snapshot (@$snapshots) {
        call($config, 'DELETE', "/volumes/$volume/snapshots/$snapshot->{name}");
    }
    delete_volume($config, $volume);
    return undef;
}

# The node answers a delete once every replica's node removed its copy,
# waiting up to 30 s for one that is offline; the deletion is committed
# first and finishes when that node returns, so a volume found deleting
# after a short wait is gone as far as Proxmox is concerned.
sub delete_volume {
    my ($config, $volume) = @_;
    my $deleted = eval { call($config, 'DELETE', "/volumes/$volume", undef, budget => 4); 1 };
    return 1 if $deleted;
    my $error = $@;
    my $info = eval { volume_info($config, $volume) };
    die $error if $@ || ($info && ($info->{state} // '') ne 'deleting');
    warn "trireme: '$volume' is deleted; a node holding a replica removes its copy when it"
        . " is back\n";
    return 1;
}

sub list_images {
    my ($class, $storeid, $scfg, $vmid, $vollist, $cache) = @_;
    my $config = config_of($scfg, $storeid);
    my $wanted = $vollist ? { map { $_ => 1 } @$vollist } : undef;
    my @images;
    for my $volume (@{ list_volumes_named($config) }) {
        my ($owner) = $volume->{name} =~ m/^(?:vm|base)-(\d+)-/;
        my $volid = "$storeid:$volume->{name}";
        if ($wanted) {
            next if !$wanted->{$volid};
        } elsif (defined($vmid)) {
            next if $owner ne $vmid;
        }
        push @images, {
            volid => $volid,
            format => 'raw',
            size => $volume->{size_bytes},
            used => $volume->{allocated_bytes},
            vmid => $owner,
            ctime => $volume->{created_unix_seconds},
        };
    }
    return \@images;
}

# Capacity as guests see it: the pools' raw bytes divided by the replicas
# each volume keeps.
sub status {
    my ($class, $storeid, $scfg, $cache) = @_;
    my $config = config_of($scfg, $storeid);
    my $nodes = call($config, 'GET', '/nodes');
    my $replicas = $scfg->{replicas};
    if (!$replicas) {
        my $groups = call($config, 'GET', '/groups');
        my $group_name = $scfg->{group} // 'default';
        my ($group) = grep { $_->{name} eq $group_name } @$groups;
        die "trireme storage '$storeid': no resource group '$group_name' in the cluster\n"
            if !$group;
        $replicas = $group->{place_count};
    }
    $replicas = 1 if !$replicas || $replicas < 1;
    my ($capacity, $free) = (0, 0);
    for my $node (@$nodes) {
        next if ($node->{state} // '') ne 'online';
        $capacity += $node->{capacity_bytes} // 0;
        $free += $node->{free_bytes} // 0;
    }
    my $total = int($capacity / $replicas);
    my $available = int($free / $replicas);
    return ($total, $available, $total - $available, 1);
}

sub activate_storage {
    my ($class, $storeid, $scfg, $cache) = @_;
    config_of($scfg, $storeid);
    return 1;
}

sub deactivate_storage {
    my ($class, $storeid, $scfg, $cache) = @_;
    return 1;
}

sub check_connection {
    my ($class, $storeid, $scfg) = @_;
    my $config = config_of($scfg, $storeid);
    my ($status) = eval { request($config, 'GET', '/status') };
    return defined($status) && $status == 200 ? 1 : 0;
}

# Attach here: nothing when this node already serves it; a second primary
# while a VM migrates here; otherwise a plain attach, which the cluster
# turns into a takeover (fencing the old primary) when the node that served
# it is offline, and refuses while that node is alive.
sub activate_volume {
    my ($class, $storeid, $scfg, $volname, $snapname, $cache, $hints) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    # A snapshot is read from its read-only export: nothing to attach.
    return 1 if $snapname;
    my $info = eval { volume_info($config, $volume) };
    if (my $error = $@) {
        return 1 if fallback_activation($config, $volume, $error);
        die $error;
    }
    die "trireme storage '$storeid': no volume '$volume' in the cluster"
        . " (`trireme volume list` shows what exists)\n"
        if !$info;
    my $here = local_node($config)->{node_name};
    if (!is_primary_on($info, $here)) {
        my $migration = $ENV{PVE_MIGRATED_FROM} ? 1 : 0;
        my $answer = call(
            $config, 'POST',
            "/volumes/$volume/attach",
            { node => $here, allow_two_primaries => $migration ? JSON::true : JSON::false },
        );
        for my $fenced (@{ $answer->{fenced} // [] }) {
            warn "trireme: took '$volume' over from node '$fenced->{node}' ($fenced->{state}):"
                . " it is fenced; do not start this VM there again\n";
        }
    }
    write_file(attached_marker($config, $volume), "$here\n");
    wait_served($config, $volume);
    make_device($config, $volume) if kernel_devices_here($config);
    return 1;
}

# With no API answering, a volume this node attached before (and still
# serves: its trireme node runs) activates anyway, as QEMU needs nothing
# else; anything else fails with the API's error.
sub fallback_activation {
    my ($config, $volume, $error) = @_;
    return 0 if $error !~ /no trireme node answered/;
    return 0 if !-e attached_marker($config, $volume);
    my $node = eval { local_node($config) } or return 0;
    return 0 if !socket_alive($node->{nbd_unix_socket});
    warn "trireme: the cluster's API does not answer; '$volume' was attached on this node"
        . " ($node->{node_name}) and its socket is up, so it is used as it is. $error";
    return 1;
}

sub deactivate_volume {
    my ($class, $storeid, $scfg, $volname, $snapname, $cache) = @_;
    return 1 if $snapname;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    my $info = eval { volume_info($config, $volume) };
    if (my $error = $@) {
        warn "trireme: '$volume' stays attached here: $error";
        return 1;
    }
    return 1 if !$info;
    release_device_here($config, $volume) or return 1;
    my $here = local_node($config)->{node_name};
    if (is_primary_on($info, $here)) {
        call($config, 'POST', "/volumes/$volume/detach", { node => $here });
    }
    unlink(attached_marker($config, $volume));
    return 1;
}

# QEMU (or the container) has let go of the device by now: it goes back
# to the node. A device still mounted is refused by the node (an error);
# with this node's trireme not answering, the device and the attachment
# stay, with a warning (false), as for an attachment with no API.
sub release_device_here {
    my ($config, $volume) = @_;
    return 1 if !kernel_devices_here($config) && !-l device_link($config, $volume);
    return 1 if eval { release_device($config, $volume) };
    my $error = $@;
    die $error if $error !~ /no trireme node answered/;
    warn "trireme: '$volume' keeps its device and stays attached here: $error";
    return 0;
}

# QEMU reaches the volume through its kernel nbd device where the local
# node makes them (the stable link, valid once activated), else through
# the local node's unix socket.
sub path {
    my ($class, $scfg, $volname, $storeid, $snapname) = @_;
    my ($vtype, $volume, $vmid) = $class->parse_volname($volname);
    my $config = config_of($scfg, $storeid);
    if ($snapname) {
        my $url = snapshot_url($config, $volume, $snapname);
        return ($url, $vmid, $vtype);
    }
    return (device_link($config, $volume), $vmid, $vtype) if kernel_devices_here($config);
    my $socket = socket_of($config);
    return ("nbd:unix:$socket:exportname=$volume", $vmid, $vtype);
}

sub snapshot_url {
    my ($config, $volume, $snapname) = @_;
    check_snapshot_name($snapname);
    my $snapshots = call($config, 'GET', "/volumes/$volume/snapshots");
    my ($snapshot) = grep { $_->{name} eq $snapname } @$snapshots;
    die "trireme: volume '$volume' has no snapshot '$snapname'\n" if !$snapshot;
    die "trireme: snapshot '$volume\@$snapname' has no NBD export (state $snapshot->{state})\n"
        if !$snapshot->{nbd_url};
    return $snapshot->{nbd_url};
}

sub qemu_blockdev_options {
    my ($class, $scfg, $storeid, $volname, $machine_version, $options) = @_;
    my $volume = $class->volume_of($volname);
    my $config = config_of($scfg, $storeid);
    if (my $snapname = $options->{'snapshot-name'}) {
        my $url = snapshot_url($config, $volume, $snapname);
        my ($host, $port, $export) = $url =~ m!^nbd://\[?([^\]/]+?)\]?:(\d+)/(.+)$!
            or die "trireme: unexpected snapshot URL '$url'\n";
        return {
            driver => 'nbd',
            server => { type => 'inet', host => $host, port => "$port" },
            export => $export,
        };
    }
    if (kernel_devices_here($config)) {
        return { driver => 'host_device', filename => device_link($config, $volume) };
    }
    return {
        driver => 'nbd',
        server => { type => 'unix', path => socket_of($config) },
        export => $volume,
        'reconnect-delay' => $NBD_RECONNECT_DELAY_SECONDS,
    };
}

sub volume_size_info {
    my ($class, $scfg, $storeid, $volname, $timeout) = @_;
    my $config = config_of($scfg, $storeid);
    my $info = existing_volume($config, $class->volume_of($volname));
    return wantarray ? ($info->{size_bytes}, 'raw', $info->{allocated_bytes}, undef)
        : $info->{size_bytes};
}

# Growing. A volume with a kernel nbd device here (its VM runs here, or it
# is activated) grows in place: the node gives the device the new size,
# and this returns once the device shows it, for qemu-server's
# block_resize that follows (QEMU refuses to grow a host device past its
# size). A running VM that reaches its disk through the NBD socket is
# refused before anything changes: QEMU's NBD client does not see a new
# size while connected. A disk attached here with no VM running is grown
# and attached again, so the next open sees the new size.
sub volume_resize {
    my ($class, $scfg, $storeid, $volname, $size, $running, $snapname) = @_;
    die "trireme: a snapshot cannot be resized\n" if $snapname;
    my $volume = $class->volume_of($volname);
    my $config = config_of($scfg, $storeid);
    my $bytes = ceil($size / $BLOCK_BYTES) * $BLOCK_BYTES;
    my $device = kernel_devices_here($config) ? device_of($config, $volume) : undef;
    refuse_running_resize($config, $volume) if $running && !$device;
    my $info = existing_volume($config, $volume);
    die "trireme: '$volume' is " . human_size($info->{size_bytes}) . "; it can only grow\n"
        if $bytes < $info->{size_bytes};
    if ($device) {
        call($config, 'POST', "/volumes/$volume/grow", { size_bytes => int($bytes) })
            if $bytes > $info->{size_bytes};
        grow_device_to($config, $volume, $bytes);
        return 1;
    }
    my $here = local_node($config)->{node_name};
    my $was_here = is_primary_on($info, $here);
    detach_here_or_refuse($config, $info, 'grow');
    call($config, 'POST', "/volumes/$volume/grow", { size_bytes => int($bytes) });
    if ($was_here) {
        call($config, 'POST', "/volumes/$volume/attach", { node => $here });
        write_file(attached_marker($config, $volume), "$here\n");
        wait_served($config, $volume);
    }
    return 1;
}

# Why a running VM's disk cannot grow here, and what would let it.
sub refuse_running_resize {
    my ($config, $volume) = @_;
    my $why = kernel_devices_here($config)
        ? "its VM was started before this node made kernel nbd devices, and reaches it through"
            . " the NBD socket"
        : "this node's trireme makes no kernel nbd devices (its kernel has no nbd module:"
            . " `modprobe nbd`, then restart trireme and the VM), so QEMU reaches it through the"
            . " NBD socket";
    die "trireme: cannot grow '$volume' while its VM runs: $why, and QEMU's NBD client would"
        . " not see the new size. Shut the VM down, resize, and start it again\n";
}

# --- snapshots, clones, templates --------------------------------------------

sub volume_snapshot {
    my ($class, $scfg, $storeid, $volname, $snap) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    call($config, 'POST', "/volumes/$volume/snapshots", { name => check_snapshot_name($snap) });
    return undef;
}

sub volume_snapshot_info {
    my ($class, $scfg, $storeid, $volname) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    # Proxmox's replication asks about volumes that may not exist: none.
    return {} if !volume_info($config, $volume);
    my $snapshots = call($config, 'GET', "/volumes/$volume/snapshots");
    my $info = {};
    my $order = 0;
    for my $snapshot (sort { $a->{id} <=> $b->{id} } @$snapshots) {
        next if $snapshot->{name} eq $BASE_SNAPSHOT;
        $info->{ $snapshot->{name} } = {
            id => $snapshot->{id},
            timestamp => $snapshot->{created_unix_seconds},
            order => $order++,
            'virtual-size' => $snapshot->{size_bytes},
        };
    }
    return $info;
}

sub volume_snapshot_list {
    my ($class, $scfg, $storeid, $volname) = @_;
    return [sort keys %{ $class->volume_snapshot_info($scfg, $storeid, $volname) }];
}

sub volume_rollback_is_possible {
    my ($class, $scfg, $storeid, $volname, $snap, $blockers) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    check_snapshot_name($snap);
    my $snapshots = call($config, 'GET', "/volumes/$volume/snapshots");
    die "trireme: volume '$volume' has no snapshot '$snap'\n"
        if !grep { $_->{name} eq $snap } @$snapshots;
    return 1;
}

# A rollback needs the volume detached; this node lets go of it first. A
# volume attached on another node (its VM running there) is refused.
sub volume_snapshot_rollback {
    my ($class, $scfg, $storeid, $volname, $snap) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    my $info = existing_volume($config, $volume);
    detach_here_or_refuse($config, $info, 'roll back');
    call($config, 'POST', "/volumes/$volume/rollback", { snapshot => check_snapshot_name($snap) });
    return undef;
}

sub volume_snapshot_delete {
    my ($class, $scfg, $storeid, $volname, $snap, $running) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    call($config, 'DELETE', "/volumes/$volume/snapshots/" . check_snapshot_name($snap));
    return undef;
}

sub volume_snapshot_needs_fsfreeze { return 1; }

# trireme takes a snapshot of a running VM's volume itself, at one write
# boundary on every replica.
sub volume_qemu_snapshot_method { return 'storage'; }

sub rename_snapshot {
    my ($class, $scfg, $storeid, $volname, $source_snap, $target_snap) = @_;
    die "trireme: snapshots cannot be renamed\n";
}

# A clone of a snapshot shares the snapshot's chunks and is a volume of its
# own (no chain): from a template (`base-...`, its base snapshot) or from
# any snapshot of a disk.
sub clone_image {
    my ($class, $scfg, $storeid, $volname, $vmid, $snapname) = @_;
    my $config = config_of($scfg, $storeid);
    my (undef, $volume, undef, undef, undef, $is_base) = $class->parse_volname($volname);
    die "trireme: '$volname' is not a template and no snapshot was named\n"
        if !$is_base && !$snapname;
    my $snapshot = $snapname ? check_snapshot_name($snapname) : $BASE_SNAPSHOT;
    my $name = $class->find_free_diskname($storeid, $scfg, $vmid);
    my $request = { name => $name };
    $request->{group} = $scfg->{group} if $scfg->{group};
    call($config, 'POST', "/volumes/$volume/snapshots/$snapshot/clone", $request);
    return $name;
}

# A template's disk: `vm-100-disk-0` becomes `base-100-disk-0`, a clone of
# the disk's base snapshot (no data copied); the disk itself goes.
sub create_base {
    my ($class, $storeid, $scfg, $volname) = @_;
    my $config = config_of($scfg, $storeid);
    my (undef, $volume, $vmid, undef, undef, $is_base) = $class->parse_volname($volname);
    die "trireme: '$volname' is a template already\n" if $is_base;
    my $info = existing_volume($config, $volume);
    detach_here_or_refuse($config, $info, 'make a template of');
    my $base = $volume =~ s/^vm-/base-/r;
    die "trireme: a volume '$base' exists already\n" if volume_info($config, $base);
    copy_under_new_name($config, $volume, $base);
    call($config, 'POST', "/volumes/$base/snapshots", { name => $BASE_SNAPSHOT });
    return $base;
}

# Proxmox's rename (a disk reassigned to another VM): trireme keeps a
# volume's name for life, so the volume is cloned under the new name (no
# data copied) and the old one deleted. Its snapshots would not follow, so
# a volume with snapshots is refused.
sub rename_volume {
    my ($class, $scfg, $storeid, $source_volname, $target_vmid, $target_volname) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($source_volname);
    $target_volname = $class->find_free_diskname($storeid, $scfg, $target_vmid)
        if !$target_volname;
    my (undef, $target) = $class->parse_volname($target_volname);
    die "trireme: illegal name '$target' - should be 'vm-$target_vmid-*'\n"
        if $target !~ m/^vm-$target_vmid-/;
    die "trireme: a volume '$target' exists already\n" if volume_info($config, $target);
    my $info = existing_volume($config, $volume);
    my $snapshots = call($config, 'GET', "/volumes/$volume/snapshots");
    die "trireme: cannot rename '$volume': it has snapshots ("
        . join(', ', map { $_->{name} } @$snapshots)
        . "), which would not follow; delete them first\n"
        if @$snapshots;
    detach_here_or_refuse($config, $info, 'rename');
    copy_under_new_name($config, $volume, $target);
    return "$storeid:$target";
}

# `volume` again as `target`, sharing its chunks, then `volume` deleted.
sub copy_under_new_name {
    my ($config, $volume, $target) = @_;
    my $snapshot = 'rename.' . int(time());
    call($config, 'POST', "/volumes/$volume/snapshots", { name => $snapshot });
    eval {
        call($config, 'POST', "/volumes/$volume/snapshots/$snapshot/clone", { name => $target });
        # The clone is made from the snapshot on each node holding it; the
        # original may go only once every one of them has it.
        my $deadline = time() + 30;
        while ((volume_info($config, $target)->{state} // '') eq 'creating') {
            die "trireme: the copy '$target' of '$volume' is still being made after 30 s;"
                . " '$volume' was kept\n"
                if time() > $deadline;
            sleep(0.2);
        }
    };
    if (my $error = $@) {
        eval { call($config, 'DELETE', "/volumes/$volume/snapshots/$snapshot") };
        die $error;
    }
    my $snapshots = call($config, 'GET', "/volumes/$volume/snapshots");
    call($config, 'DELETE', "/volumes/$volume/snapshots/$_->{name}") for @$snapshots;
    delete_volume($config, $volume);
}

sub volume_has_feature {
    my ($class, $scfg, $feature, $storeid, $volname, $snapname, $running, $opts) = @_;
    my $features = {
        snapshot => { current => 1, snap => 1 },
        clone => { base => 1, snap => 1 },
        template => { current => 1 },
        copy => { base => 1, current => 1, snap => 1 },
        sparseinit => { base => 1, current => 1 },
        rename => { current => 1 },
    };
    my (undef, undef, undef, undef, undef, $is_base) = $class->parse_volname($volname);
    my $key = $snapname ? 'snap' : $is_base ? 'base' : 'current';
    return $features->{$feature}->{$key} ? 1 : undef;
}

# --- kernel block devices (containers) ----------------------------------------

# A container's disk is the volume's kernel nbd device, made by the local
# trireme node (activating it here first). Where the node makes none (no
# nbd module) containers cannot use the storage on this node.
sub map_volume {
    my ($class, $storeid, $scfg, $volname, $snapname, $hints) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    die "trireme: snapshots cannot be mapped as block devices\n" if $snapname;
    die "trireme: this node's trireme makes no kernel nbd devices (its kernel has no nbd module:"
        . " `modprobe nbd`, then restart trireme), so '$volume' cannot be a container's disk"
        . " here (VMs can: QEMU reaches the NBD socket itself)\n"
        if !kernel_devices_here($config);
    $class->activate_volume($storeid, $scfg, $volname);
    return make_device($config, $volume)->{device};
}

# The device goes back to the node (refused while mounted). A device that
# an older version of this plugin connected with qemu-nbd is disconnected.
sub unmap_volume {
    my ($class, $storeid, $scfg, $volname, $snapname) = @_;
    my $config = config_of($scfg, $storeid);
    my $volume = $class->volume_of($volname);
    my $legacy = state_dir($config) . "/mapped-$volume";
    if (defined(my $device = read_file($legacy))) {
        chomp($device);
        system('qemu-nbd', '--disconnect', $device) if -b $device;
        unlink($legacy);
    }
    release_device_here($config, $volume);
    return 1;
}

1;
