#!/usr/bin/perl
# Prints the files perl loads to run the Proxmox plugin and its tests
# (integrations/proxmox/t/40-kernel-nbd.t, t/bin/pve-volume) in the kernel nbd guest: every
# module in %INC and every shared object of an XS module, after using what
# the tests use (some modules load others only when first called). Run by
# assemble.sh with -I for the plugin and its t/lib; the guest gets these
# files at the same paths, and the perl binary.
use strict;
use warnings;

my @loaded;
# Registered before Test::More's own END block, so it runs after it.
BEGIN {
    eval q{ END { print "$_\n" for @loaded } 1 } or die $@;
}

use HTTP::Tiny;
use IO::Socket::UNIX;
use JSON;
use POSIX qw(WNOHANG ceil);
use Socket qw(SOCK_STREAM);
use Test::More;
use Time::HiRes qw(time sleep);
use File::Path qw(make_path remove_tree);
use Getopt::Long;
use TriremeTest;
use PVE::Storage::Custom::TriremePlugin;
use PVE::Storage::Custom::Trireme::Api qw(config_of request);

Test::More->builder->output('/dev/null');
Test::More->builder->failure_output('/dev/null');
# The HTTP client as the plugin calls it, to a port where nothing listens.
my $config = config_of({ api => 'http://127.0.0.1:9', token => 't' }, 'probe');
eval { request($config, 'GET', '/node', undef, budget => 1) };
HTTP::Tiny->new(timeout => 1)->get('http://127.0.0.1:9/');
IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => '/nonexistent');
my $json = JSON->new->canonical->encode({ a => [1, JSON::true], b => 'x' });
decode_json($json);
my $scratch = "/tmp/perl-files-$$";
make_path("$scratch/a");
remove_tree($scratch);
ok(1, 'ok');
is(1, 1, 'is');
is_deeply([{ a => 1 }], [{ a => 1 }], 'is_deeply');
like('abc', qr/b/, 'like');
diag('diag');
note('note');
SKIP: { skip 'skip', 1; }
done_testing();

push @loaded, sort grep { defined && -f } values %INC;
require DynaLoader;
push @loaded, grep { -f } @DynaLoader::dl_shared_objects;
