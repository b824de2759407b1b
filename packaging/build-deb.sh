#!/bin/sh
# Builds the trireme .deb: the binary, the node's systemd unit and its
# settings file, the client config file, the Proxmox VE storage plugin, and
# shell completions and man pages made by the binary from its own clap
# definitions. Needs only dpkg-deb, make, perl and gzip (no debhelper).
#
#   packaging/build-deb.sh                     # cargo build --release, then package
#   packaging/build-deb.sh --binary PATH --out DIR
#   DEB_COMPRESS=none packaging/build-deb.sh ...   (fast, for tests; default xz)
#
# Prints the path of the .deb it wrote.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
binary=
out="$repo/target/debian"

usage() {
    echo "usage: $0 [--binary PATH_TO_TRIREME] [--out DIR]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) [ $# -ge 2 ] || usage; binary=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "$0: unknown argument '$1'" >&2; usage ;;
    esac
done

for tool in dpkg-deb make perl gzip; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "$0: '$tool' is missing: install it (apt-get install dpkg-dev make perl gzip)" >&2
        exit 1
    }
done

if [ -z "$binary" ]; then
    (cd "$repo" && cargo build --release -p trireme) >&2
    binary="$repo/target/release/trireme"
fi
[ -x "$binary" ] || { echo "$0: '$binary' is not an executable trireme binary" >&2; exit 1; }

# `trireme 0.1.0` -> 0.1.0: the package is versioned as the binary it holds.
version=$("$binary" --version | awk '{print $2}')
[ -n "$version" ] || { echo "$0: '$binary --version' printed no version" >&2; exit 1; }
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)

stage=$(mktemp -d "${TMPDIR:-/tmp}/trireme-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT INT TERM
root="$stage/root"
mkdir -p "$root/DEBIAN"

install -D -m 0755 "$binary" "$root/usr/bin/trireme"
install -D -m 0644 "$repo/packaging/trireme.service" "$root/usr/lib/systemd/system/trireme.service"
install -D -m 0644 "$repo/packaging/trireme.default" "$root/etc/default/trireme"
install -D -m 0644 "$repo/packaging/client.toml" "$root/etc/trireme/client.toml"

# The plugin's own install target: files land where Proxmox loads them.
make -s -C "$repo/integrations/proxmox" install DESTDIR="$root" PERL5DIR=/usr/share/perl5 >&2

"$binary" generate completions bash >"$stage/bash"
"$binary" generate completions zsh >"$stage/zsh"
"$binary" generate completions fish >"$stage/fish"
install -D -m 0644 "$stage/bash" "$root/usr/share/bash-completion/completions/trireme"
install -D -m 0644 "$stage/zsh" "$root/usr/share/zsh/vendor-completions/_trireme"
install -D -m 0644 "$stage/fish" "$root/usr/share/fish/vendor_completions.d/trireme.fish"

"$binary" generate man "$stage/man"
install -d -m 0755 "$root/usr/share/man/man1"
for page in "$stage"/man/*.1; do
    gzip -9n <"$page" >"$root/usr/share/man/man1/$(basename "$page").gz"
    chmod 0644 "$root/usr/share/man/man1/$(basename "$page").gz"
done

install -D -m 0644 "$repo/docs/proxmox.md" "$root/usr/share/doc/trireme/proxmox.md"

# dpkg keeps an admin's edits of these over upgrades.
printf '/etc/default/trireme\n/etc/trireme/client.toml\n' >"$root/DEBIAN/conffiles"

installed_size=$(du -sk --exclude=DEBIAN "$root" | awk '{print $1}')
cat >"$root/DEBIAN/control" <<CONTROL
Package: trireme
Version: $version
Architecture: $arch
Maintainer: trireme developers <trireme@localhost>
Installed-Size: $installed_size
Depends: libc6
Recommends: nbd-client, nbdfuse | libnbd-bin, fuse3
Enhances: libpve-storage-perl
Section: admin
Priority: optional
Description: replicated block storage for small hyperconverged clusters
 trireme keeps thin volumes replicated on several nodes and serves them over
 NBD. This package holds the node daemon and command-line client (trireme),
 its systemd unit (trireme.service, not started until configured in
 /etc/default/trireme), and the Proxmox VE storage plugin (type trireme).
CONTROL

install -m 0755 "$repo/packaging/postinst" "$root/DEBIAN/postinst"
install -m 0755 "$repo/packaging/prerm" "$root/DEBIAN/prerm"
install -m 0755 "$repo/packaging/postrm" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/trireme_${version}_${arch}.deb"
dpkg-deb --root-owner-group "-Z${DEB_COMPRESS:-xz}" --build "$root" "$deb" >&2
echo "$deb"
