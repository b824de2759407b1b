# Bad input gets a clear error and changes nothing: names Proxmox would
# never make, unknown volumes, a storage.cfg entry without its addresses or
# token, a cluster that does not answer (within 10 s, naming the nodes
# tried), and a volume attached on another node that is alive. Also the
# fallback: a volume this node serves still activates with no API.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);
use TriremeTest;

my $plugin = plugin();
my ($n1, $n2) = node_names();
my $on1 = scfg_on($n1);
my $on2 = scfg_on($n2);

sub volume_names { return [sort map { $_->{name} } @{ (api_get('/volumes'))[1] }]; }
my $before = volume_names();

# --- names ---
for my $bad ('foo', 'vm-abc-disk-0', 'vm-101', '../vm-101-disk-0', 'vm-101-disk-0/../x',
    'base-1-disk-0/vm-2-disk-0/x', 'vm-101-disk 0', '', "vm-101-disk-0\n")
{
    dies_like(sub { $plugin->parse_volname($bad) }, [qr/not a volume name Proxmox makes|no volume name/],
        "volume name '" . ($bad =~ s/\n/\\n/r) . "'");
}
dies_like(sub { $plugin->alloc_image('tri', $on1, 101, 'raw', 'vm-999-disk-0', 1024) },
    [qr/illegal name 'vm-999-disk-0' - should be 'vm-101-\*'/], 'a name of another VM');
dies_like(sub { $plugin->alloc_image('tri', $on1, 101, 'qcow2', undef, 1024) },
    [qr/format 'qcow2' is not possible/], 'qcow2');
dies_like(sub { $plugin->alloc_image('tri', $on1, 101, 'raw', undef, 0) },
    [qr/not a positive number/], 'size 0');
dies_like(sub { $plugin->volume_snapshot($on1, 'tri', 'vm-101-disk-0', '__bad') },
    [qr/not a snapshot name Proxmox makes/], 'a snapshot name Proxmox would not make');

# --- unknown volumes ---
dies_like(sub { $plugin->activate_volume('tri', $on1, 'vm-101-disk-77') },
    [qr/no volume 'vm-101-disk-77' in the cluster/], 'activating an unknown volume');
dies_like(sub { $plugin->free_image('tri', $on1, 'vm-101-disk-77', 0) },
    [qr/no volume 'vm-101-disk-77'/], 'freeing an unknown volume');
dies_like(sub { $plugin->volume_size_info($on1, 'tri', 'vm-101-disk-77') },
    [qr/no volume 'vm-101-disk-77'/], 'the size of an unknown volume');
is_deeply($plugin->volume_snapshot_info($on1, 'tri', 'vm-101-disk-77'), {},
    'an unknown volume has no snapshots (as Proxmox\'s replication expects)');

# --- the storage.cfg entry ---
dies_like(sub { PVE::Storage::Plugin->parse_config('storage.cfg', "trireme: x\n\ttoken t\n",
            { trireme => $plugin }) },
    [qr/missing value for required option 'api'/], 'Proxmox refuses an entry without api');
dies_like(sub { $plugin->status('tri-noapi', scfg_on($n1, 'tri', api => '')) },
    [qr/no API address/, qr/storage\.cfg/], 'no api');
dies_like(sub { $plugin->status('tri-notoken', scfg_on($n1, 'tri', token => '')) },
    [qr/no admin token/, qr/admin\.token/], 'no token');
dies_like(sub { $plugin->status('tri', scfg_on($n1, 'tri', token => 'wrong')) },
    [qr/token is wrong/], 'a wrong token (from another host than loopback it matters)')
    if $ENV{TRIREME_TEST_TOKEN_CHECKED};
dies_like(sub { $plugin->status('tri', scfg_on($n1, 'tri', api => 'ftp://x')) },
    [qr/is not http:\/\/HOST:PORT/], 'an address that is no URL');

# --- a cluster that does not answer ---
my $down = scfg_on($n1, 'tri-down');
for my $case (
    [status => sub { $plugin->status('tri-down', $down) }],
    [alloc => sub { $plugin->alloc_image('tri-down', $down, 101, 'raw', undef, 1024) }],
    [activate => sub { $plugin->activate_volume('tri-down', $down, 'vm-101-disk-5') }],
    [free => sub { $plugin->free_image('tri-down', $down, 'vm-101-disk-5', 0) }],
)
{
    my ($error, $took) = dies_like($case->[1],
        [qr/no trireme node answered/, map { qr/\Q$_\E/ } split(/,/, $down->{api})],
        "$case->[0] with the cluster down names the nodes tried");
    ok($took < 10, sprintf("%s failed in %.1f s (under 10 s)", $case->[0], $took));
}

# --- attached elsewhere, on a live node ---
my $busy = $plugin->alloc_image('tri', $on2, 201, 'raw', undef, 4096);
ok($plugin->activate_volume('tri', $on2, $busy), 'a VM on n2 uses it');
dies_like(sub { $plugin->activate_volume('tri', $on1, $busy) },
    [qr/attached on node '\Q$n2\E'/, qr/still counts as online/, qr/last heard/],
    'activating on n1 while n2 is alive (not a migration)');
is_deeply(primaries($busy), [$n2], 'n2 alone still serves it');
dies_like(sub { $plugin->free_image('tri', $on1, $busy, 0) },
    [qr/attached on \Q$n2\E/, qr/stop it there first/], 'deleting it from n1');
dies_like(sub { $plugin->volume_resize($on1, 'tri', $busy, 8 << 20, 0) },
    [qr/attached on \Q$n2\E/], 'growing it from n1');
dies_like(sub { $plugin->volume_snapshot_rollback($on1, 'tri', $busy, 'nope') },
    [qr/attached on \Q$n2\E/], 'rolling it back from n1');
is(($plugin->volume_size_info($on1, 'tri', $busy))[0], 4 << 20, 'its size did not change');

# --- no API, but this node serves the volume: it still activates ---
my $down2 = scfg_on($n2, 'tri-down');
my $warned = '';
{
    local $SIG{__WARN__} = sub { $warned .= $_[0] };
    ok($plugin->activate_volume('tri', $down2, $busy),
        'n2 activates what it serves with no API answering');
}
like($warned, qr/does not answer.*attached on this node/s, 'and says why');
dies_like(sub { $plugin->activate_volume('tri', $down2, 'vm-201-disk-9') },
    [qr/no trireme node answered/], 'a volume it does not serve is not');

ok($plugin->deactivate_volume('tri', $on2, $busy), 'deactivate');
$plugin->free_image('tri', $on2, $busy, 0);
is_deeply(volume_names(), $before, 'no volume was left behind or lost');

done_testing();
