package TriremeTest;

# What the plugin's tests share: the cluster the cargo test started (from
# the environment), the storage.cfg entries of each simulated Proxmox node,
# and qemu-io to read and write volumes exactly as QEMU would open them.

use strict;
use warnings;

use Exporter qw(import);
use HTTP::Tiny;
use JSON;
use Test::More;

use PVE::Storage::Plugin;
use PVE::Storage::Custom::TriremePlugin;

our @EXPORT = qw(
    plugin storage_cfg scfg_on node_names api_get primaries qemu_io have_qemu_io
    dies_like
);

my $PLUGIN = 'PVE::Storage::Custom::TriremePlugin';

sub plugin { return $PLUGIN; }

# TRIREME_TEST_NODES: `n1=http://127.0.0.1:P,n2=...`, in order.
sub nodes {
    my $spec = $ENV{TRIREME_TEST_NODES}
        or BAIL_OUT('TRIREME_TEST_NODES is not set: run these tests through'
            . ' `cargo test -p trireme --test proxmox`, which starts the cluster');
    return map { [split(/=/, $_, 2)] } split(/,/, $spec);
}

sub node_names { return map { $_->[0] } nodes(); }

sub api_of {
    my ($name) = @_;
    my ($node) = grep { $_->[0] eq $name } nodes();
    die "no test node $name\n" if !$node;
    return $node->[1];
}

# The storage.cfg every Proxmox node shares: `tri` is the storage under
# test; `tri-down` lists addresses where no node answers.
sub storage_cfg {
    my $apis = join(',', map { $_->[1] } nodes());
    my $token = $ENV{TRIREME_TEST_TOKEN} // die "TRIREME_TEST_TOKEN is not set\n";
    my $dead = $ENV{TRIREME_TEST_DEAD_APIS} // 'http://127.0.0.1:9';
    return <<"CFG";
trireme: tri
\tapi $apis
\ttoken $token
\tcontent images,rootdir
\tshared 1

trireme: tri-down
\tapi $dead
\ttoken $token
\tshared 1
CFG
}

# The parsed entry of `storeid` as the Proxmox node `node` sees it: the
# same storage.cfg, with `local-api` pointing at that node's trireme (on a
# real cluster every node has its own at the default address).
sub scfg_on {
    my ($node, $storeid, %override) = @_;
    $storeid //= 'tri';
    my $parsed = PVE::Storage::Plugin->parse_config('storage.cfg', storage_cfg(),
        { trireme => $PLUGIN });
    my $scfg = { %{ $parsed->{ids}{$storeid} }, 'local-api' => api_of($node), %override };
    return $scfg;
}

sub api_get {
    my ($path) = @_;
    my $api = (nodes())[0][1];
    my $response = HTTP::Tiny->new(timeout => 10)->get("$api/api/v1$path",
        { headers => { Authorization => "Bearer $ENV{TRIREME_TEST_TOKEN}" } });
    return ($response->{status}, eval { decode_json($response->{content}) });
}

sub primaries {
    my ($volume) = @_;
    my ($status, $info) = api_get("/volumes/$volume");
    return $status == 200 ? [sort @{ $info->{primaries} }] : undef;
}

sub have_qemu_io {
    return system('sh', '-c', 'command -v qemu-io >/dev/null 2>&1') == 0;
}

# qemu-io on what the plugin gives QEMU: a `-drive` path (PVE 8) or the
# blockdev options (PVE 9; a key `-r` opens it read-only, as QEMU opens a
# snapshot). Returns (ok, output).
sub qemu_io {
    my ($target, @commands) = @_;
    my @read_only;
    if (ref($target) && delete(local $target->{'-r'})) {
        @read_only = ('-r');
    }
    my @image = ref($target)
        ? ('json:' . encode_json({ driver => 'raw', file => $target }))
        : ('-f', 'raw', $target);
    my @args = ('qemu-io', @read_only, @image, map { ('-c', $_) } @commands);
    my $output = `@{[ join(' ', map { shell_quote($_) } @args) ]} 2>&1`;
    my $ok = $? == 0 && $output !~ /(?:failed|Pattern verification failed|error)/i;
    return ($ok, $output);
}

sub shell_quote {
    my ($word) = @_;
    return "'" . ($word =~ s/'/'\\''/gr) . "'";
}

# Runs `code`, which must die with a message matching every pattern.
sub dies_like {
    my ($code, $patterns, $name) = @_;
    my $started = Time::HiRes::time();
    my $ok = eval { $code->(); 1 };
    my $error = $@;
    my $took = Time::HiRes::time() - $started;
    if ($ok) {
        fail("$name: did not fail");
        return;
    }
    my @missing = grep { $error !~ $_ } @$patterns;
    ok(!@missing, "$name: fails with a clear message")
        or diag("message: $error\nmissing: @missing");
    return wantarray ? ($error, $took) : $error;
}

1;
