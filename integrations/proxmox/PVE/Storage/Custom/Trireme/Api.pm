package PVE::Storage::Custom::Trireme::Api;

# The trireme storage plugin's REST client: the storage's configuration
# (API addresses, token) and requests that try each node in turn within a
# bounded time. Part of the trireme Proxmox VE plugin (Apache-2.0).

use strict;
use warnings;

use Exporter qw(import);
use HTTP::Tiny;
use JSON;
use Socket qw(SOCK_STREAM);
use Time::HiRes qw(time);

our @EXPORT_OK = qw(config_of request call volume_info existing_volume);

# Every API call, over all the nodes tried, ends within this many seconds,
# so that Proxmox's tasks fail quickly with a message naming the nodes.
our $REQUEST_BUDGET_SECONDS = 9;
# Connecting to one node: a dead address should not eat the whole budget.
our $CONNECT_TIMEOUT_SECONDS = 2;
our $DEFAULT_LOCAL_API = 'http://127.0.0.1:7450';

sub config_of {
    my ($scfg, $storeid) = @_;
    $storeid //= $scfg->{storage} // '?';
    my @apis = grep { $_ ne '' } map { s/^\s+|\s+$//gr } split(/[,;\s]+/, $scfg->{api} // '');
    die "trireme storage '$storeid': no API address: add `api http://NODE:7450,...`"
        . " (one or more trireme nodes) to its entry in /etc/pve/storage.cfg\n"
        if !@apis;
    for my $api (@apis) {
        die "trireme storage '$storeid': API address '$api' is not http://HOST:PORT\n"
            if $api !~ m!^https?://[^/\s]+/?$!;
    }
    my $token = $scfg->{token} // '';
    die "trireme storage '$storeid': no admin token: add `token ...` (the content of"
        . " DATA/admin.token on any trireme node) to its entry in /etc/pve/storage.cfg\n"
        if $token eq '';
    my @trimmed = map { s!/$!!r } @apis;
    return {
        storeid => $storeid,
        apis => \@trimmed,
        token => $token,
        local_api => ($scfg->{'local-api'} // $DEFAULT_LOCAL_API) =~ s!/$!!r,
    };
}

# One request to the cluster: each API address in turn until one answers
# (any HTTP status), within $REQUEST_BUDGET_SECONDS in all. A connection
# that fails moves on to the next node; a request that was sent but not
# answered in time does not (a change may still happen: retrying it
# elsewhere could make it twice). Returns ($status, $body-or-undef).
sub request {
    my ($config, $method, $path, $body, %options) = @_;
    my @addresses = $options{addresses} ? @{ $options{addresses} } : @{ $config->{apis} };
    my $deadline = time() + ($options{budget} // $REQUEST_BUDGET_SECONDS);
    my @tried;
    for my $address (@addresses) {
        my $left = $deadline - time();
        last if $left <= 0.2;
        my $http = HTTP::Tiny->new(
            timeout => $left,
            agent => 'trireme-pve-plugin/1',
            verify_SSL => 0,
        );
        my $connect = connect_check($address, $left);
        if (defined($connect)) {
            push @tried, "$address ($connect)";
            next;
        }
        my $response = $http->request(
            $method,
            "$address/api/v1$path",
            {
                headers => {
                    'Authorization' => "Bearer $config->{token}",
                    'Content-Type' => 'application/json',
                    'Accept' => 'application/json',
                },
                defined($body) ? (content => encode_json($body)) : (),
            },
        );
        if ($response->{status} == 599) {
            my $why = ($response->{content} // 'no answer') =~ s/\s+$//r;
            push @tried, "$address ($why)";
            # Sent but not answered: stop here (see above).
            last if $method ne 'GET' && $why =~ /timed? ?out/i;
            next;
        }
        my $decoded = eval { decode_json($response->{content} // '') };
        return ($response->{status}, $decoded, $address);
    }
    my $budget = $options{budget} // $REQUEST_BUDGET_SECONDS;
    die "trireme storage '$config->{storeid}': no trireme node answered $method $path within"
        . " ${budget} s; tried: "
        . (@tried ? join(', ', @tried) : join(', ', @addresses))
        . ". Check that the nodes run and that `api` in /etc/pve/storage.cfg lists them\n";
}

# undef when a TCP connection to the API address opens within the time
# left, else why not. Keeps a dead address from taking the whole budget.
sub connect_check {
    my ($address, $left) = @_;
    my ($host, $port) = $address =~ m!^https?://\[?([^\]/]+?)\]?(?::(\d+))?$!;
    return 'not an address' if !defined($host);
    $port //= $address =~ /^https/ ? 443 : 80;
    my $timeout = $left < $CONNECT_TIMEOUT_SECONDS ? $left : $CONNECT_TIMEOUT_SECONDS;
    require IO::Socket::IP;
    my $socket = IO::Socket::IP->new(
        PeerHost => $host,
        PeerPort => $port,
        Type => SOCK_STREAM,
        Timeout => $timeout,
    );
    return ($! ? "$!" : 'cannot connect') =~ s/\s+$//r if !$socket;
    close($socket);
    return undef;
}

# A request that must succeed: dies with the node's own message otherwise
# (trireme's messages name what was wrong and what to do next).
sub call {
    my ($config, $method, $path, $body, %options) = @_;
    my ($status, $answer) = request($config, $method, $path, $body, %options);
    return $answer if $status >= 200 && $status < 300;
    my $message = ref($answer) eq 'HASH' && $answer->{error} ? $answer->{error} : "HTTP $status";
    die "trireme: $message\n";
}

# The volume as the cluster knows it, or undef when there is none.
sub volume_info {
    my ($config, $volume) = @_;
    my ($status, $answer) = request($config, 'GET', "/volumes/$volume");
    return undef if $status == 404;
    return $answer if $status == 200;
    die "trireme: " . (ref($answer) eq 'HASH' ? $answer->{error} // "HTTP $status" : "HTTP $status")
        . "\n";
}

sub existing_volume {
    my ($config, $volume) = @_;
    my $info = volume_info($config, $volume);
    die "trireme storage '$config->{storeid}': no volume '$volume' in the cluster"
        . " (`trireme volume list` shows what exists)\n"
        if !$info;
    return $info;
}

1;
