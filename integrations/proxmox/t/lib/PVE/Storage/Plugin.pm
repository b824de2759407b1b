package PVE::Storage::Plugin;

# STAND-IN for tests only: Proxmox VE cannot be installed here, so this is
# the least of pve-storage's PVE::Storage::Plugin that the trireme plugin
# and its tests touch: the disk-name helper and a storage.cfg parser in the
# format of PVE::SectionConfig (required options, known options only). It
# is never installed; on Proxmox the real module is used.

use strict;
use warnings;

our $MAX_VOLUMES_PER_GUEST = 1024;

# The first free `vm-VMID-disk-N` among the names given, as Proxmox picks it.
sub get_next_vm_diskname {
    my ($disk_list, $storeid, $vmid, $fmt, $scfg, $add_fmt_suffix) = @_;
    my %taken;
    for my $disk (@$disk_list) {
        $taken{$1} = 1 if $disk =~ m/(?:^|[:\/])(?:vm|base)-$vmid-disk-(\d+)$/;
    }
    for my $index (0 .. $MAX_VOLUMES_PER_GUEST - 1) {
        return "vm-$vmid-disk-$index" if !$taken{$index};
    }
    die "unable to allocate an image name for VM $vmid in storage '$storeid'\n";
}

# storage.cfg text -> { ids => { STOREID => { type => ..., KEY => VALUE } } },
# checked against the plugin's options() as PVE::SectionConfig does.
sub parse_config {
    my ($class, $filename, $raw, $plugins) = @_;
    my $ids = {};
    my ($current, $storeid);
    my $line_number = 0;
    for my $line (split(/\n/, $raw // '')) {
        $line_number++;
        next if $line =~ m/^\s*(?:#.*)?$/;
        if ($line =~ m/^(\S+):\s*(\S+)\s*$/) {
            my ($type, $id) = ($1, $2);
            my $plugin = $plugins->{$type} or die "$filename:$line_number: unknown type '$type'\n";
            $storeid = $id;
            $current = $ids->{$id} = { type => $type, storage => $id };
            next;
        }
        if ($line =~ m/^\s+(\S+)(?:\s+(.*?))?\s*$/ && $current) {
            my ($key, $value) = ($1, $2 // 1);
            my $options = $plugins->{ $current->{type} }->options();
            die "$filename:$line_number: storage '$storeid': unknown option '$key'\n"
                if !exists($options->{$key});
            $current->{$key} = $value;
            next;
        }
        die "$filename:$line_number: cannot parse '$line'\n";
    }
    for my $id (sort keys %$ids) {
        my $options = $plugins->{ $ids->{$id}{type} }->options();
        for my $key (sort keys %$options) {
            die "$filename: storage '$id': missing value for required option '$key'\n"
                if !$options->{$key}{optional} && !defined($ids->{$id}{$key});
        }
    }
    return { ids => $ids };
}

1;
